"""Gemma's SentencePiece tokenizer from a GGUF file (`tokenizer.ggml.model = "llama"`, arch gemma3).

A Gemma file lists the vocabulary (`tokenizer.ggml.tokens`, with scores and token types) but no
merges. The tokenizer is rebuilt as transformers' GGUF conversion builds it (`gemma_tokenizer` in
integrations/gguf, then `GemmaTokenizer`), so both give the same ids:
- a token made only of spaces ("  ") is respelled with SentencePiece's "▁";
- the merges are every split of a token into two tokens of the vocabulary, ranked by the
  merged token's place in the file (earlier first: Gemma's merge order), a token's splits with the
  longer left part first;
- BPE with byte fallback (`<0xNN>` tokens for bytes no token covers), spaces normalised to "▁",
  no prefix space added; decoding turns "▁" back into spaces and the byte tokens into bytes;
- `<end_of_turn>`, where the vocabulary has it, ends generation as EOS does;
- CONTROL tokens become special added tokens, USER_DEFINED ones plain added tokens (as the
  file spells them; an all-space one, respelled, is not added).
"""

from __future__ import annotations

from typing import Any

from gguf import TokenType
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _RustTokenizer

SPACE = "\u2581"
_DEFAULT_UNK = "<unk>"
# Gemma's end of turn: an end-of-generation token besides EOS (llama.cpp finds it by this text,
# and Gemma 3's generation_config lists it with EOS).
END_OF_TURN = "<end_of_turn>"


def respelled(tokens: list[str]) -> list[str]:
    """`tokens` with each all-space token spelled in "▁"s."""
    return [SPACE * len(t) if t and " " in t and not t.strip() else t for t in tokens]


def merges_from_vocab(tokens: list[str]) -> list[tuple[str, str]]:
    """The BPE merges the vocabulary implies, best first (see the module docstring)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    first = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    ranked = []
    for token in first:
        rank = vocab[token]  # a duplicate's last place, as transformers ranks it
        for cut in range(len(token) - 1, 0, -1):  # the longer left part first
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((rank, -cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def gemma_rust_tokenizer(metadata: dict[str, Any], tokens: list[str]) -> _RustTokenizer:
    """The `tokenizers` tokenizer of a Gemma vocabulary `tokens` with `metadata`'s token types."""
    spelled = respelled(tokens)
    vocab = {t: i for i, t in enumerate(spelled)}
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = spelled[unk_id] if unk_id is not None and 0 <= unk_id < len(spelled) else _DEFAULT_UNK
    tokenizer = _RustTokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges_from_vocab(spelled),
            fuse_unk=True,
            unk_token=unk,
            byte_fallback=True,
            dropout=None,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    token_types = metadata.get("tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise ValueError(f"gguf tokenizer: token_type has {len(token_types)} entries for {len(tokens)} tokens")
    # As the file spells them; a USER_DEFINED token respelled above is no longer in the vocabulary.
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, token_types) if k == TokenType.CONTROL]
    )
    user_defined = zip(tokens, token_types)
    tokenizer.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, k in user_defined
            if k == TokenType.USER_DEFINED and t in vocab
        ]
    )
    return tokenizer
