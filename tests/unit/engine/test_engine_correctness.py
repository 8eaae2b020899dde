"""The paged engine must produce exactly what a cache-free full recompute produces."""

from __future__ import annotations

import random

import pytest
from engine_helpers import complete, complete_all, greedy, reference_greedy

BLOCK_SIZE = 16
CHUNK_TOKENS = 64
MAX_TOKENS = 12
# Lengths chosen to land on and around block (16) and chunk (64) boundaries.
PROMPT_LENGTHS = [1, 2, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100, 127, 128, 129, 150, 191, 200, 230]


@pytest.fixture(scope="module")
def engine(make_engine):
    # float32 pinned: the paged path is compared token for token with the cache-free reference.
    return make_engine(
        model="tiny",
        dtype="float32",
        block_size=BLOCK_SIZE,
        num_blocks=256,
        max_model_len=512,
        max_num_batched_tokens=CHUNK_TOKENS,
    )


def random_prompts(seed: int, lengths: list[int], vocab: int = 256) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def test_batched_greedy_equals_reference(engine, loop_thread):
    prompts = random_prompts(0, PROMPT_LENGTHS)
    results = loop_thread.run(complete_all(engine, prompts, greedy(MAX_TOKENS)))
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(engine, prompt, MAX_TOKENS), f"prompt of {len(prompt)} tokens"
        assert result.finish_reason == "length"


def test_one_at_a_time_equals_batched(engine, loop_thread):
    prompts = random_prompts(1, [5, 40, 70, 130])
    batched = loop_thread.run(complete_all(engine, prompts, greedy(MAX_TOKENS)))
    for prompt, b in zip(prompts, batched):
        single = loop_thread.run(complete(engine, prompt, greedy(MAX_TOKENS)))
        assert single.token_ids == b.token_ids


def test_prefix_cache_hits_reuse_blocks_and_stay_exact(engine, loop_thread):
    shared = random_prompts(2, [3 * BLOCK_SIZE + 5])[0]
    first = loop_thread.run(complete(engine, shared + [7, 8, 9], greedy(MAX_TOKENS)))
    assert first.num_cached_tokens == 0
    variants = [shared + tail for tail in ([1], [2, 3, 4], [5] * 40)]
    results = loop_thread.run(complete_all(engine, variants, greedy(MAX_TOKENS)))
    for prompt, result in zip(variants, results):
        assert result.num_cached_tokens == 3 * BLOCK_SIZE, "the three shared full blocks must hit"
        assert result.token_ids == reference_greedy(engine, prompt, MAX_TOKENS)


def test_whole_prompt_cached_still_computes_last_token(engine, loop_thread):
    prompt = random_prompts(3, [2 * BLOCK_SIZE])[0]
    loop_thread.run(complete(engine, prompt, greedy(4)))
    again = loop_thread.run(complete(engine, prompt, greedy(4)))
    assert again.num_cached_tokens == BLOCK_SIZE  # the last block is recomputed for its logits
    assert again.token_ids == reference_greedy(engine, prompt, 4)


def test_preemption_recomputes_exactly(make_engine, loop_thread):
    # 12 blocks of 16 tokens: four requests of 40 + 30 tokens cannot all stay resident.
    small = make_engine(
        model="tiny",
        dtype="float32",
        block_size=BLOCK_SIZE,
        num_blocks=12,
        max_model_len=128,
        max_num_batched_tokens=CHUNK_TOKENS,
        enable_prefix_caching=False,
    )
    prompts = random_prompts(4, [40, 41, 42, 43])
    results = loop_thread.run(complete_all(small, prompts, greedy(30)))
    assert small.stats().num_preemptions > 0, "the test must actually exercise preemption"
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(small, prompt, 30)
