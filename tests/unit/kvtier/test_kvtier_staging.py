"""The staging arena's allocations: aligned, disjoint, freed ranges merged, bounded."""

from __future__ import annotations

import random

import pytest

from minipd.kvtier.staging import ALIGN, StagingArena


def test_allocations_are_aligned_and_disjoint_until_it_is_full():
    arena = StagingArena(64 * ALIGN)
    taken = [arena.alloc(100) for _ in range(32)]  # 100 bytes take two ALIGN units
    assert all(a is not None and a.offset % ALIGN == 0 for a in taken)
    spans = sorted((a.offset, a.offset + a.span) for a in taken)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert arena.alloc(1) is None and arena.free_bytes() == 0
    assert arena.view(taken[0]).nbytes == 100


def test_freed_ranges_merge_so_a_large_allocation_fits_again():
    arena = StagingArena(16 * ALIGN)
    rng = random.Random(7)
    taken = [arena.alloc(ALIGN) for _ in range(16)]
    for allocation in rng.sample(taken, len(taken)):  # freed in a random order
        arena.free(allocation)
    assert arena.free_bytes() == 16 * ALIGN
    whole = arena.alloc(16 * ALIGN)
    assert whole is not None and whole.offset == 0


def test_views_alias_the_arena():
    arena = StagingArena(4 * ALIGN)
    allocation = arena.alloc(10)
    arena.view(allocation)[:] = b"0123456789"
    assert bytes(arena.buffer[allocation.offset : allocation.offset + 10]) == b"0123456789"


def test_an_arena_smaller_than_one_unit_is_refused():
    with pytest.raises(ValueError):
        StagingArena(ALIGN - 1)
