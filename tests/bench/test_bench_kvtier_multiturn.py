"""`python bench.py kvtier --quick`: the multi-turn chat bench runs its three arms (strict JSON,
a table, a PNG), every arm's answers the same tokens, and the tier computes fewer prompt tokens
than the arm without it."""

from __future__ import annotations

import pytest
from test_bench_serving import bench, finite

from benchmarks.kvtier.multiturn_bench import ARMS


@pytest.mark.timeout(300)
def test_the_tier_arm_computes_less_with_the_same_answers(tmp_path):
    result, stdout = bench(tmp_path, "kvtier")
    assert result["checks_failed"] == [] and result["model"] == "tiny"
    assert set(result["arms"]) == set(ARMS)
    for arm in result["arms"].values():
        assert len(arm["ttft_p50_ms"]) == len(arm["ttft_p90_ms"]) == result["rounds"]
        assert finite(arm["ttft_p50_ms"], arm["ttft_p90_ms"], arm["hit_rate_local"], arm["hit_rate_tier"])
    no_tier, tier = result["arms"]["no_tier"], result["arms"]["tier"]
    assert no_tier["hit_rate_tier"] == 0 and tier["hit_rate_tier"] > 0
    assert tier["prefill_tokens_computed"] < no_tier["prefill_tokens_computed"]
    assert "tier / no_tier" in stdout
