"""The tokenizer and chat template built from SmolLM2's GGUF metadata, against transformers'
conversion of the same file (ids, text, rendered chat prompts) and against llama.cpp's `smollm`
pre-tokenizer rule.

The two references part on one point: llama.cpp's `smollm` rule (and SmolLM2's own
tokenizer.json, `Digits(individual_digits=True)` before GPT-2's byte-level split) cuts every
number code point off before GPT-2's regex runs, while transformers' GGUF conversion has no
entry for `smollm` and applies GPT-2's regex alone. They tokenize differently only around
numbers ("  123" with two spaces, " ½"); minipd follows llama.cpp, the tokenizer the model was
trained with. So ids are compared with transformers on every string where the two rules agree
(checked to be all but strings with numbers), and with the llama.cpp rule on every string.
"""

from __future__ import annotations

import random

import pytest
import regex
from gguf_helpers import SMOLLM2, requires_smollm2, smollm2_dir

from minipd.api.chat_template import ChatTemplate
from minipd.api.protocol import ChatMessage
from minipd.engine.model_loader import load_tokenizer_only
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.tokenizers.gguf_tokenizer import gguf_tokenizer

pytestmark = requires_smollm2

FRAGMENTS = {
    "ascii": [
        "Hello",
        "world",
        "The quick brown fox",
        "jumps over",
        "the lazy dog.",
        "I'm",
        "you're",
        "they'll",
        "don't",
        "CamelCaseWord",
        "snake_case_name",
        "UPPER",
        "a",
        "x",
        "?!",
        "...",
        "(parens)",
        "[1]",
        "e-mail",
        "https://example.com/a?b=c&d=e",
        "#hashtag",
        "@user",
        "50%",
        "$3.50",
        "1,000,000",
    ],
    "digits": ["0", "7", "42", "2024", "3.14159", "123456789", "v1.2.3", "x2", "10x", "1e-5", "0xFF"],
    "accents": [
        "héllo",
        "wörld",
        "café",
        "naïve",
        "Ångström",
        "façade",
        "Øresund",
        "crème brûlée",
        "Ελληνικά",
        "Привет мир",
        "ñandú",
        "İstanbul",
        "ß",
        "ﬁ ligature",
    ],
    "cjk": ["世界", "你好，世界！", "日本語のテキスト", "한국어 문장", "中文文本。", "カタカナ", "漢字かな交じり文"],
    "emoji": ["🚀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🙂🙃", "⭐"],
    "space": [" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", " \n ", "\r\n", "   \n\t  "],
    "code": [
        "def f(x):\n    return x ** 2\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "SELECT * FROM t WHERE id = 1;",
        '<div class="a">b</div>',
        '{"key": [1, 2, null]}',
        "x = lambda y: y  # comment",
        "#include <stdio.h>",
        'fn main() { println!("hi"); }',
    ],
    "special": [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>user\nhi<|im_end|>\n",
        "<repo_name>",
        "<file_sep>",
        "<|im_start|><|im_end|>",
        "<|im_start",
        "im_end|>",
    ],
}
# Numbers beyond ASCII digits, where the two references part most (see the module docstring).
OTHER_NUMERALS = ["½", "²", "x²", " ½ cup", "٣", "Ⅻ", "①②", "¾¾", "10½", " ³"]
NUM_RANDOM_STRINGS = 220
GPT2_SPLIT = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")


def corpus(seed: int = 0) -> list[str]:
    """Every fragment alone, and random joins of 1-6 fragments with random separators."""
    rng = random.Random(seed)
    pool = [f for group in FRAGMENTS.values() for f in group]
    strings = list(pool) + ["", "a" * 60, " " * 17, "\n" * 9]
    for _ in range(NUM_RANDOM_STRINGS):
        parts = rng.choices(pool, k=rng.randint(1, 6))
        strings.append("".join(p + rng.choice(["", " ", "  ", "\n", "\t", ""]) for p in parts))
    return strings


@pytest.fixture(scope="module")
def ours():
    return gguf_tokenizer(read_gguf(smollm2_dir() / SMOLLM2.file))


@pytest.fixture(scope="module")
def theirs():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2.file)


def _llama_cpp_smollm_ids(theirs, text: str) -> list[int]:
    """llama.cpp's `smollm` pre-tokenization, done by hand: special tokens matched whole, every
    \\p{N} code point isolated, then GPT-2's split; each piece then BPE-encoded by transformers alone."""
    specials = sorted((t.content for t in theirs.added_tokens_decoder.values() if t.special), key=len, reverse=True)
    ids: list[int] = []
    for segment in regex.split("(" + "|".join(map(regex.escape, specials)) + ")", text):
        if segment in specials:
            ids.append(theirs.convert_tokens_to_ids(segment))
            continue
        for piece in regex.split(r"(\p{N})", segment):
            for word in GPT2_SPLIT.findall(piece):
                ids += theirs.encode(word, add_special_tokens=False)
    return ids


def test_encode_and_decode_equal_transformers(ours, theirs):
    strings = corpus()
    agreeing = [t for t in strings if _llama_cpp_smollm_ids(theirs, t) == theirs.encode(t, add_special_tokens=False)]
    assert len(agreeing) >= 200
    # where the references part, it is only ever around numbers
    assert all(regex.search(r"\p{N}", t) for t in set(strings) - set(agreeing))
    for text in agreeing:
        ids = theirs.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_bos=False) == ids, repr(text)
        assert ours.encode(text) == theirs.encode(text), repr(text)  # add_bos_token is false in this file
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), repr(text)


def test_encode_follows_llama_cpps_smollm_rule_on_every_string(ours, theirs):
    for text in corpus() + OTHER_NUMERALS:
        ids = ours.encode(text, add_bos=False)
        assert ids == _llama_cpp_smollm_ids(theirs, text), repr(text)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), repr(text)


def test_decode_of_arbitrary_ids_equals_transformers(ours, theirs):
    rng = random.Random(1)
    for _ in range(100):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(1, 12))]
        ids += rng.sample(range(17), 2)  # special ids among them, left out by both
        rng.shuffle(ids)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids


def test_special_tokens_and_their_text(ours, theirs):
    assert (ours.bos_token, ours.eos_token) == (theirs.bos_token, theirs.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (ours.bos_token_id, ours.eos_token_ids, ours.vocab_size) == (1, (2,), len(theirs))
    assert ours.encode("<|im_end|>", add_bos=False) == [2]
    assert ours.decode([1, 2, 0, 19556]) == "Hello"  # special ids are left out


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And  3 + 3?\n"},
    ],
    [{"role": "user", "content": "héllo 世界 🚀"}, {"role": "assistant", "content": "<|im_end|> is special"}],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=lambda c: "-".join(m["role"] for m in c))
def test_chat_template_renders_like_transformers(ours, theirs, conversation, add_generation_prompt):
    template = ChatTemplate.for_tokenizer(ours)
    assert not template.is_builtin
    rendered = template.render([ChatMessage(m["role"], m["content"]) for m in conversation], add_generation_prompt)
    expected = theirs.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert rendered == expected
    assert ours.encode(rendered) == _llama_cpp_smollm_ids(theirs, expected)


def test_the_router_reads_the_tokenizer_without_touching_weights(monkeypatch, ours):
    from minipd.models.gguf import gguf_file, gguf_loader

    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer alone must not read tensor data")

    monkeypatch.setattr(gguf_file.GGUFFile, "tensor_bytes", refuse)
    monkeypatch.setattr(gguf_loader, "dequantize_tensor", refuse)
    tokenizer = load_tokenizer_only("smollm2")
    assert tokenizer.encode("Paris is nice") == ours.encode("Paris is nice")
    assert tokenizer.chat_template == ours.chat_template
