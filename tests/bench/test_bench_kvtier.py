"""`python bench.py kvtier-ops --quick`: the shared KV tier's calls timed on every store this host has
(the fake always), every round bytes-exact, against memcpy of the same bytes; then fetch against
recompute over the prefix length on the tiny model, with the break-even measured and the one the
fetch-or-recompute choice learned in the same run (strict JSON, a table, a PNG)."""

from __future__ import annotations

import pytest
from test_bench_serving import bench, finite

from benchmarks.kvtier.kvtier_bench import OPERATIONS, STORES


@pytest.mark.timeout(300)
def test_kvtier_bench_times_every_store_it_can_run(tmp_path):
    result, stdout = bench(tmp_path, "kvtier-ops")
    assert result["checks_failed"] == [] and result["rounds"] == 2 and result["blocks"] == 16
    assert set(result["stores"]) | set(result["skipped"]) == set(STORES) and "fake" in result["stores"]
    assert result["bytes_per_round"] == 16 * 4 * 32 * 1024 and finite(result["memcpy_ms"])
    for measured in result["stores"].values():
        assert finite(*(measured[f"{name}_ms"] for name in OPERATIONS), measured["fetch_to_memcpy"])
        assert all(len(measured["runs_ms"][name]) == 2 for name in OPERATIONS)
    assert "fetch ms" in stdout and "memcpy" in stdout
    tiny = result["break_even"]["tiny"]
    assert tiny["lengths"] == [16, 64] and tiny["block_bytes"] > 0
    assert finite(*tiny["recompute_ms"], *tiny["local_ms"], *tiny["compute_ms"])
    assert set(tiny["stores"]) == set(result["stores"])  # every store that ran
    for store in tiny["stores"].values():
        assert finite(*store["fetch_ms"], *store["tier_ms"])
        assert store["break_even_tokens"] in (None, 16, 64)
        learned = store["model"]
        assert finite(learned["lookup_ms"], learned["fetch_latency_ms"], learned["token_ms"])
    assert "fetch vs recompute, tiny" in stdout and "break-even measured" in stdout
