"""The trace replay's window and scaling (benchmarks/kvtier/trace_window.py): equal leading hash
ids give equal leading token blocks and nothing more; every prompt's tail is its own; the
window is read from its start, its hash ids capped, its times from its first request; and the
unbounded-cache bound counts a hash id only where its whole prefix came before."""

from __future__ import annotations

import json

import pytest

from benchmarks.kvtier.trace_window import Scaling, TraceRequest, bound_hit_blocks, read_window

SCALING = Scaling(block_tokens=8, tail_tokens=3, vocab=1000)


def request(index: int, *hash_ids: int) -> TraceRequest:
    return TraceRequest(index, 0.0, tuple(hash_ids), 4)


def test_equal_ids_share_exactly_their_blocks_and_tails_are_each_prompts_own():
    a, b = SCALING.prompt(request(0, 5, 6, 7)), SCALING.prompt(request(1, 5, 6, 9))
    assert len(a) == len(b) == 3 * 8 + 3
    assert a[:16] == b[:16] and a[16:24] != b[16:24] and a[24:] != b[24:]
    assert SCALING.prompt(request(0, 5, 6, 7)) == a  # deterministic
    assert all(3 <= t < 1000 for t in a)


def test_the_window_is_read_from_its_start_capped_and_timed_from_its_first(tmp_path):
    rows = [{"timestamp": 1000 * i, "input_length": 9, "output_length": i, "hash_ids": [0, i, i + 1]} for i in range(6)]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    window = read_window(str(path), 2, 3, 2)
    assert [(r.index, r.arrival_s, r.hash_ids, r.output_tokens) for r in window] == [
        (2, 0.0, (0, 2), 2),
        (3, 1.0, (0, 3), 3),
        (4, 2.0, (0, 4), 4),
    ]
    with pytest.raises(ValueError, match="the trace has 6 requests"):
        read_window(str(path), 4, 3, 2)


def test_the_bound_counts_a_hash_id_only_after_its_whole_prefix():
    window = [request(0, 1, 2, 3), request(1, 1, 2, 4), request(2, 9, 2, 3), request(3, 1, 2, 4, 5), request(4, 1)]
    assert bound_hit_blocks(window) == [0, 2, 0, 3, 1]
