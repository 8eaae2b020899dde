"""The GGUF pre-tokenizers `qwen2` and `llama-bpe` split text exactly as llama.cpp's regexes for
them do (run here by the `regex` package), and a GGUF vocabulary with either gives the same ids
as transformers' tokenizer built from the same file, on strings chosen to catch a wrong split:
digits, contractions in any case, CJK, whitespace runs, line ends, code, emoji; special tokens
stay whole and the chat template comes from the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import regex
from qwen2_gguf import SPECIAL_TOKENS, hf_qwen2, trained_vocab, write_qwen2_gguf

from minipd.api.chat_template import ChatTemplate
from minipd.api.protocol import ChatMessage
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.tokenizers.gguf_tokenizer import PRE_TOKENIZERS, _byte_alphabet, gguf_tokenizer

# llama.cpp's own spelling (llama-vocab.cpp): contractions case by case instead of (?i:...)
LLAMA_CPP_REGEX = {
    "qwen2": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "llama-bpe": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}
TRICKY = [
    "Hello world",
    "It's 12:45, we've 3,000 apples; I'M sure YOU'LL see. Don'T.",
    "x = 1234567890 + 0.5e-10 - 42",
    "机器学习很有趣。東京は晴れです！",
    "   leading spaces and trailing   ",
    "tabs\tand\n\nnewlines\r\n\r\nwindows\n",
    "def f(x):\n    return x ** 2  # square\n\n\n    \n",
    "emoji 🤖🚀!! and naïve café",
    "a\u0301 decomposed accent",
    "!!!???...--- ((([[{",
    "١٢٣ arabic and ४५६ devanagari digits",
    "'s'S 'll ' 'x",
]


def byte_level(piece: str) -> str:
    spelling = _byte_alphabet()
    return "".join(spelling[b] for b in piece.encode("utf-8"))


@pytest.mark.parametrize("pre", sorted(LLAMA_CPP_REGEX))
@pytest.mark.parametrize("text", TRICKY)
def test_pre_tokenizer_splits_like_llama_cpp(pre: str, text: str) -> None:
    expected = regex.findall(LLAMA_CPP_REGEX[pre], text)
    assert "".join(expected) == text
    ours = [piece for piece, _ in PRE_TOKENIZERS[pre](False).pre_tokenize_str(text)]
    assert ours == [byte_level(piece) for piece in expected]


def test_qwen2_and_llama_bpe_differ_on_digit_runs() -> None:
    split = {pre: PRE_TOKENIZERS[pre](False).pre_tokenize_str("x 12345") for pre in LLAMA_CPP_REGEX}
    assert [p for p, _ in split["qwen2"]] == ["x", "Ġ", "1", "2", "3", "4", "5"]
    assert [p for p, _ in split["llama-bpe"]] == ["x", "Ġ", "123", "45"]


@pytest.fixture(scope="module", params=["qwen2", "llama-bpe"])
def vocab_file(request, tmp_path_factory) -> Path:
    vocab = trained_vocab(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    return write_qwen2_gguf(directory / "vocab.gguf", hf_qwen2(len(vocab.tokens), num_hidden_layers=1), vocab)


def test_ids_equal_transformers_from_the_same_file(vocab_file: Path) -> None:
    from transformers import AutoTokenizer

    ours = gguf_tokenizer(read_gguf(vocab_file))
    theirs = AutoTokenizer.from_pretrained(vocab_file.parent, gguf_file=vocab_file.name)
    for text in TRICKY:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text
    merged = ours.encode("fibonacci")
    assert len(merged) < len("fibonacci"), "the trained merges must be used"


def test_special_tokens_and_the_chat_template_come_from_the_file(vocab_file: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = gguf_tokenizer(read_gguf(vocab_file))
    start, end = (tokenizer.encode(t) for t in ("<|im_start|>", "<|im_end|>"))
    assert len(start) == len(end) == 1
    assert tokenizer.eos_token_ids == tuple(end) and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.bos_token == "<|endoftext|>" and tokenizer.encode("hi")[0] != tokenizer.bos_token_id
    assert tokenizer.vocab_size == len(trained_vocab(read_gguf(vocab_file).metadata["tokenizer.ggml.pre"]).tokens)
    template = ChatTemplate.for_tokenizer(tokenizer)
    text = template.render([ChatMessage(role="user", content="Write 2+2 in code")])
    assert text == (
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n"
        "<|im_start|>user\nWrite 2+2 in code<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.encode(text)
    assert ids.count(start[0]) == 3 and ids.count(end[0]) == 2
    theirs = AutoTokenizer.from_pretrained(vocab_file.parent, gguf_file=vocab_file.name)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text.replace(SPECIAL_TOKENS[1], "").replace(SPECIAL_TOKENS[2], "")
