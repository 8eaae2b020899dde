"""The tokenizer a GGUF file describes, rebuilt with the `tokenizers` library.

A GGUF carries no tokenizer.json: its metadata holds the vocabulary (`tokenizer.ggml.tokens`,
`token_type`), the BPE merges, the special token ids, whether to add BOS, the name of the
pre-tokenizer llama.cpp applies (`tokenizer.ggml.pre`) and the chat template. Supported:

- `tokenizer.ggml.model = "gpt2"`: byte-level BPE (GPT-2, SmolLM, Llama 3, Qwen2, ... files);
- `tokenizer.ggml.model = "llama"` (SentencePiece) in a gemma3 file: Gemma's tokenizer
  (gemma_tokenizer.py; BOS added unless the file says not to; `<end_of_turn>` ends generation
  too); SentencePiece in any other
  architecture and the other models are refused by name.
- `tokenizer.ggml.pre`: `default`/`gpt2` (GPT-2's split regex), `smollm` (each digit
  split off first, then GPT-2's regex: llama.cpp groups it with StarCoder's, and it is the
  pre-tokenizer of SmolLM's own tokenizer.json), `qwen2` (Qwen2's regex: single digits, a letter
  run with one leading non-letter, punctuation runs with their line breaks) and `llama-bpe`
  (Llama 3's: the same but digits in runs of up to three), each of the last two split by its
  regex as its tokenizer.json does (`Split`, isolated) and then byte-level without a regex;
  anything else is refused by name, because splitting text differently from the merges'
  training yields other ids without any error. No normalizer: llama.cpp and transformers'
  GGUF conversion apply none (Qwen2's own tokenizer.json adds NFC, which changes only text with
  decomposed accents).

Tokens are built as transformers' GGUF conversion builds them, so both give the same ids:
a token spelled outside GPT-2's byte alphabet is respelled as its UTF-8 bytes; CONTROL tokens
(token type 3) become special added tokens (matched whole, left out by `decode`), except
ones spelled outside the byte alphabet (llama.cpp mislabels); USER_DEFINED ones (type 4) plain
added tokens. BOS is added when `tokenizer.ggml.add_bos_token` says so (default: no, as for
byte-level BPE in llama.cpp). EOS ids: EOS, end-of-turn and end-of-message ids.
"""

from __future__ import annotations

from typing import Any, Callable

from gguf import TokenType
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _RustTokenizer

from minipd.models.gguf.gguf_file import GGUFFile
from minipd.models.tokenizers.gemma_tokenizer import END_OF_TURN, gemma_rust_tokenizer
from minipd.models.tokenizers.tokenizer import HFTokenizer

SUPPORTED_TOKENIZER_MODELS = ("gpt2",)
_SENTENCEPIECE = "llama"
_GEMMA_ARCHITECTURES = ("gemma3",)
_DEFAULT_PRE = "default"

_TOKENS, _TOKEN_TYPES, _MERGES = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"
_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")

# The split regexes of Qwen2's and Llama 3's tokenizer.json (llama.cpp runs the same, with the
# case-insensitive contractions spelled out: llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2 / LLAMA3).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2(add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)


def _digits_then_gpt2(add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2(add_prefix_space)])


def _split_then_bytes(pattern: str) -> Callable[[bool], pre_tokenizers.PreTokenizer]:
    def build(add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
            ]
        )

    return build


PRE_TOKENIZERS: dict[str, Callable[[bool], pre_tokenizers.PreTokenizer]] = {
    "default": _gpt2,
    "gpt2": _gpt2,
    "smollm": _digits_then_gpt2,
    "qwen2": _split_then_bytes(QWEN2_SPLIT),
    "llama-bpe": _split_then_bytes(LLAMA3_SPLIT),
}


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (`bytes_to_unicode` in GPT-2's encoder.py)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _required(metadata: dict[str, Any], key: str) -> Any:
    if metadata.get(key) is None:
        raise ValueError(f"gguf tokenizer: required metadata {key!r} is missing")
    return metadata[key]


def _special_text(metadata: dict[str, Any], key: str, tokens: list[str]) -> str | None:
    token_id = metadata.get(key)
    if token_id is None:
        return None
    if not 0 <= token_id < len(tokens):
        raise ValueError(f"gguf tokenizer: {key} = {token_id} is outside the vocabulary of {len(tokens)} tokens")
    return tokens[token_id]


def _rust_tokenizer(metadata: dict[str, Any], tokens: list[str]) -> _RustTokenizer:
    pre = metadata.get("tokenizer.ggml.pre", _DEFAULT_PRE)
    if pre not in PRE_TOKENIZERS:
        raise ValueError(
            f"gguf tokenizer: tokenizer.ggml.pre {pre!r} is not supported; supported: {sorted(PRE_TOKENIZERS)}"
        )
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        spelled = token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8"))
        vocab[spelled] = index  # a duplicate spelling keeps the last id, as llama.cpp and transformers do
    merges = [tuple(merge.split(" ", 1)) for merge in _required(metadata, _MERGES)]
    tokenizer = _RustTokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre](bool(metadata.get("tokenizer.ggml.add_space_prefix", False)))
    tokenizer.decoder = decoders.ByteLevel()
    token_types = metadata.get(_TOKEN_TYPES) or [TokenType.NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise ValueError(f"gguf tokenizer: {_TOKEN_TYPES} has {len(token_types)} entries for {len(tokens)} tokens")
    special = [
        AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, token_types)
        if kind == TokenType.CONTROL and set(t) <= alphabet
    ]
    user_defined = [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, token_types)
        if kind == TokenType.USER_DEFINED and t in vocab
    ]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user_defined)
    return tokenizer


def gguf_tokenizer(file: GGUFFile) -> HFTokenizer:
    """The tokenizer (with chat template and special tokens) that `file`'s metadata describes.

    Raises ValueError naming an unsupported tokenizer model or pre-tokenizer, or missing or
    inconsistent tokenizer metadata.
    """
    metadata = file.metadata
    model = metadata.get("tokenizer.ggml.model")
    gemma = model == _SENTENCEPIECE and metadata.get("general.architecture") in _GEMMA_ARCHITECTURES
    if model == _SENTENCEPIECE and not gemma:
        raise ValueError(
            f"gguf tokenizer: tokenizer.ggml.model {model!r} (SentencePiece) in {file.path} is not supported for "
            f"architecture {metadata.get('general.architecture')!r}; only for {list(_GEMMA_ARCHITECTURES)}"
        )
    if model not in SUPPORTED_TOKENIZER_MODELS and not gemma:
        raise ValueError(
            f"gguf tokenizer: tokenizer.ggml.model {model!r} in {file.path} is not supported; "
            f"supported: {list(SUPPORTED_TOKENIZER_MODELS)} (byte-level BPE)"
        )
    tokens = list(_required(metadata, _TOKENS))
    extra_eos = [int(metadata[k]) for k in _EOS_KEYS if metadata.get(k) is not None]
    if gemma and END_OF_TURN in tokens:
        extra_eos.append(tokens.index(END_OF_TURN))
    for token_id in extra_eos:
        if not 0 <= token_id < len(tokens):
            raise ValueError(
                f"gguf tokenizer: an end-of-generation id {token_id} is outside the vocabulary of {len(tokens)} tokens"
            )
    return HFTokenizer(
        gemma_rust_tokenizer(metadata, tokens) if gemma else _rust_tokenizer(metadata, tokens),
        bos_token=_special_text(metadata, "tokenizer.ggml.bos_token_id", tokens),
        eos_token=_special_text(metadata, "tokenizer.ggml.eos_token_id", tokens),
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", gemma)),
        chat_template=metadata.get("tokenizer.chat_template"),
        extra_eos_token_ids=extra_eos,
    )
