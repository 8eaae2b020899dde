"""Decode grouping: similar context lengths attend together, and grouping changes no output."""

from __future__ import annotations

import random

import torch
from engine_helpers import greedy

from minipd.engine.decode_groups import split_by_length
from minipd.engine.model_runner import ModelRunner
from minipd.engine.request import Request
from minipd.engine.scheduler import ScheduledChunk


def _padded(counts, groups) -> int:
    return sum((end - start) * counts[end - 1] for start, end in groups)


def test_groups_cover_every_decode_in_order_and_cut_padding():
    rng = random.Random(0)
    counts = sorted(rng.randint(2, 48) for _ in range(64))
    groups = split_by_length(counts, max_groups=3, overhead_blocks=16)
    assert groups[0][0] == 0 and groups[-1][1] == len(counts) and len(groups) == 3
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
    assert _padded(counts, groups) < 0.75 * len(counts) * counts[-1]


def test_no_group_is_made_that_saves_less_than_it_costs():
    assert split_by_length([]) == []
    assert split_by_length([5] * 10) == [(0, 10)]  # equal lengths: nothing to save
    assert split_by_length([1, 2], overhead_blocks=16) == [(0, 2)]  # saving 1 block
    assert split_by_length([1] * 8 + [40] * 8, overhead_blocks=16) == [(0, 8), (8, 16)]
    assert split_by_length([1] * 8 + [40] * 8, max_groups=1) == [(0, 16)]


def test_a_grouped_decode_step_matches_one_request_at_a_time(make_engine):
    """Decodes of very different lengths in one step (so the step is split into groups) give
    the logits each would get alone."""
    engine = make_engine(model="tiny", dtype="float32", num_blocks=256, max_model_len=1024)
    runner = ModelRunner(engine.model, engine.kv_pool)
    bm = engine.block_manager
    rng = random.Random(1)
    lengths = [3, 5, 300, 310, 700, 20, 650]
    requests = []
    for i, n in enumerate(lengths):
        r = Request(f"g-{i}", [rng.randrange(256) for _ in range(n)], greedy(4))
        r.block_ids = bm.reserve(bm.blocks_for(n + 1))
        requests.append(r)
    try:
        engine.run_on_compute_thread(runner.execute, [ScheduledChunk(r, len(r.token_ids), True) for r in requests])
        for r in requests:
            r.num_computed_tokens = len(r.token_ids)
            r.token_ids.append(7)
        chunks = [ScheduledChunk(r, 1, True) for r in requests]

        def logits_of(batch):
            _, positions, meta, _, _ = runner._prepare(batch)
            ids = torch.tensor([c.request.token_ids[-1] for c in batch])
            index = torch.arange(len(batch))
            return meta, engine.model(ids, positions, engine.kv_pool, meta, index, runner.buffers)

        order = sorted(chunks, key=lambda c: c.request.num_computed_tokens)
        meta, together = engine.run_on_compute_thread(logits_of, order)
        assert len(meta.decode_groups) > 1
        for row, chunk in enumerate(order):
            _, alone = engine.run_on_compute_thread(logits_of, [chunk])
            assert torch.allclose(together[row], alone[0], atol=1e-4, rtol=1e-4)
    finally:
        for r in requests:
            bm.free(r.block_ids)
