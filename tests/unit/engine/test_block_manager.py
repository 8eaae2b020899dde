"""The torch-free block manager: references, prefix caching, LRU reuse, reservations, accounting."""

from __future__ import annotations

import pytest

from minipd.engine.block_manager import BlockManager, OutOfBlocks, chain_hashes

BS = 4


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_allocate_and_free_return_the_pool_to_full():
    bm = BlockManager(8, BS)
    blocks, cached = bm.allocate(tokens(10))
    assert len(blocks) == 3 and cached == 0
    assert bm.usage().num_used == 3 and bm.usage().num_free == 5
    bm.free(blocks)
    assert bm.usage().num_free == 8


def test_double_free_is_an_error():
    bm = BlockManager(4, BS)
    blocks, _ = bm.allocate(tokens(4))
    bm.free(blocks)
    with pytest.raises(RuntimeError, match="freed more often"):
        bm.free(blocks)


def test_out_of_blocks_is_typed_and_leaves_state_intact():
    bm = BlockManager(2, BS)
    with pytest.raises(OutOfBlocks):
        bm.allocate(tokens(9))
    assert bm.usage().num_free == 2


def test_prefix_hit_shares_blocks_with_ref_counts():
    bm = BlockManager(16, BS)
    a, _ = bm.allocate(tokens(10))
    bm.register_computed(a, tokens(10), 10)  # two full blocks become cached
    b, cached = bm.allocate(tokens(9) + [99, 98])
    assert cached == 8 and b[:2] == a[:2] and b[2] != a[2]
    assert bm.usage().num_cached == 2
    bm.free(a)
    assert bm.usage().num_used == 3  # shared blocks still held by b
    bm.free(b)
    assert bm.usage().num_free == 16 and bm.usage().num_cached == 2  # cached, but free for reuse


def test_hit_requires_matching_tokens_even_on_hash_collision():
    bm = BlockManager(8, BS)
    a, _ = bm.allocate(tokens(8))
    bm.register_computed(a, tokens(8), 8)
    # Forge a collision: make the other sequence's first-block hash point at block a[0].
    other = tokens(8, start=50)
    bm._hash_to_block[chain_hashes(other, BS)[0]] = a[0]
    assert bm.match_prefix(other).num_tokens == 0
    bm.free(a)


def test_whole_prompt_hit_leaves_the_last_block_to_compute():
    bm = BlockManager(8, BS)
    a, _ = bm.allocate(tokens(8))
    bm.register_computed(a, tokens(8), 8)
    assert bm.match_prefix(tokens(8)).num_tokens == 4
    bm.free(a)


def test_lru_evicts_least_recently_freed_cached_block_after_uncached_ones():
    bm = BlockManager(3, BS)
    a, _ = bm.allocate(tokens(4, 0))
    bm.register_computed(a, tokens(4, 0), 4)
    b, _ = bm.allocate(tokens(4, 100))
    bm.register_computed(b, tokens(4, 100), 4)
    bm.free(a)
    bm.free(b)  # a is now the least recently freed cached block
    fresh = bm.reserve(1)  # the never-cached block goes first
    assert bm.match_prefix(tokens(4, 0) + [1]).num_tokens == 4
    evicting = bm.reserve(1)
    assert evicting == a
    assert bm.match_prefix(tokens(4, 0) + [1]).num_tokens == 0
    assert bm.match_prefix(tokens(4, 100) + [1]).num_tokens == 4
    bm.free(fresh + evicting)
    assert bm.usage().num_free == 3


def test_reserve_and_allocate_slots():
    bm = BlockManager(6, BS)
    reserved = bm.reserve(2)
    assert bm.usage().num_used == 2
    bm.allocate_slots(reserved, 9)  # grow to cover 9 tokens
    assert len(reserved) == 3
    with pytest.raises(OutOfBlocks):
        bm.reserve(4)
    bm.free(reserved)
    assert bm.usage().num_free == 6


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a, _ = bm.allocate(tokens(8))
    bm.register_computed(a, tokens(8), 8)
    assert bm.match_prefix(tokens(9)).num_tokens == 0 and bm.usage().num_cached == 0
    bm.free(a)


def test_allocate_prefix_takes_cached_hits_up_to_the_last_block_then_new_ones():
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = list(range(12))
    blocks, _ = bm.allocate(tokens)
    bm.register_computed(blocks, tokens, 12)
    bm.free(blocks)
    taken, hits = bm.allocate_prefix(tokens + [99] * 4, 4)
    assert hits == 3 and taken[:3] == blocks and taken[3] not in blocks  # allocate would leave the third
    bm.free(taken)
    assert bm.num_free_blocks == 8
    with pytest.raises(OutOfBlocks):
        bm.allocate_prefix([7] * 40, 10)
    assert bm.num_free_blocks == 8


def test_hold_keeps_a_block_from_reuse_until_its_last_reference_is_freed():
    bm = BlockManager(num_blocks=2, block_size=4)
    blocks, _ = bm.allocate(list(range(8)))
    bm.hold(blocks[:1])
    bm.free(blocks)
    assert bm.num_free_blocks == 1
    bm.free(blocks[:1])
    assert bm.num_free_blocks == 2
    with pytest.raises(RuntimeError):
        bm.hold(blocks[:1])  # a free block cannot be held
