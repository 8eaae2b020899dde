"""The load generator's metric computations, on hand-made records (no processes)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from benchmarks.loadgen.stats import format_summary, summarize
from minipd.ops.loadgen.records import RequestRecord, attainment, good_requests
from minipd.slo.goodput import ATTAINMENT_TARGET, bandwidth_threshold, bisect_goodput, goodput_from_sweep
from minipd.slo.latency import percentile
from minipd.slo.targets import SLO


def record(
    ttft_ms: float = 100.0,
    itl_ms: tuple[float, ...] = (10.0, 10.0),
    success: bool = True,
    output_tokens: int | None = None,
    index: int = 0,
) -> RequestRecord:
    itl = [g / 1e3 for g in itl_ms]
    return RequestRecord(
        index=index,
        scheduled_s=0.0,
        sent_s=0.0,
        url="u",
        prompt_len=8,
        output_len=len(itl) + 1,
        success=success,
        error=None if success else "HTTP 503: overloaded",
        ttft_s=ttft_ms / 1e3,
        itl_s=itl,
        e2el_s=(ttft_ms + sum(itl_ms)) / 1e3,
        prompt_tokens=8,
        output_tokens=len(itl) + 1 if output_tokens is None else output_tokens,
        usage_reported=True,
    )


@pytest.mark.parametrize("p", [0, 10, 50, 90, 99, 100])
def test_percentiles_match_numpy(p):
    values = [random.Random(p).uniform(0, 100) for _ in range(37)]
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


def test_percentile_of_nothing_is_nan_and_bad_p_is_refused():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], 101)


def test_tpot_excludes_the_first_token_and_uses_the_reported_count():
    # 3 events after the first, but the server reported 7 tokens (several per event)
    r = record(ttft_ms=200, itl_ms=(30, 30, 30), output_tokens=7)
    assert r.tpot_s == pytest.approx((0.290 - 0.200) / 6)
    assert record(itl_ms=(), output_tokens=1).tpot_s == 0.0  # vLLM counts a one-token request as TPOT 0


def test_a_request_is_good_only_when_it_meets_every_slo_and_failures_never_are():
    slo = SLO.parse(["ttft:150", "tpot:20"])
    records = [
        record(ttft_ms=100, itl_ms=(10, 10)),  # good
        record(ttft_ms=200, itl_ms=(10, 10)),  # TTFT too slow
        record(ttft_ms=100, itl_ms=(10, 50)),  # TPOT 30 ms
        record(ttft_ms=100, success=False),
    ]  # failed, whatever its numbers
    assert good_requests(records, slo).tolist() == [True, False, False, False]
    assert attainment(records, slo) == 0.25
    assert good_requests(records, SLO()).tolist() == [True, True, True, False]  # no SLO: every success is good


def test_the_itl_objective_bounds_each_requests_own_p90_gap():
    slo = SLO.parse(["itl:40"])
    steady = record(itl_ms=(10,) * 19 + (100,))  # one stall in twenty gaps: P90 stays at 10 ms
    stalling = record(itl_ms=(10, 100) * 10)  # a stall every other gap
    single = record(itl_ms=(), output_tokens=1)  # no gaps: met trivially
    assert good_requests([steady, stalling, single], slo).tolist() == [True, False, True]


def test_summary_follows_vllm_and_counts_failures():
    records = [record(ttft_ms=100, itl_ms=(10, 20)), record(ttft_ms=300, itl_ms=(30,)), record(success=False)]
    summary = summarize(records, duration_s=2.0, slo=SLO.parse(["ttft:200"]))
    assert (summary.completed, summary.failed, summary.num_good) == (2, 1, 1)
    assert summary.request_throughput == 1.0 and summary.request_goodput == 0.5
    assert summary.attainment == pytest.approx(1 / 3)
    assert summary.total_output_tokens == 3 + 2 and summary.output_throughput == 2.5
    assert summary.ttft.mean == pytest.approx(0.2) and summary.ttft.p50 == pytest.approx(0.2)  # seconds
    assert summary.itl.count == 3 and summary.itl.mean == pytest.approx(0.02)
    assert summary.tpot.p90 == pytest.approx(np.percentile([0.015, 0.03], 90))
    assert summary.errors == ["HTTP 503: overloaded"]
    text = format_summary(summary)
    assert "Request goodput (req/s):" in text and "Failed requests:" in text
    assert "Mean TTFT (ms):                         200.00" in text  # the table prints milliseconds


def synthetic_attainment(rate: float) -> float:
    """1 up to 1 req/s, then falling by 0.5 per req/s: it crosses the 90% target at 1.2 req/s."""
    return max(0.0, min(1.0, 1.0 - (rate - 1.0) * 0.5))


def test_goodput_from_a_sweep_interpolates_the_first_crossing():
    rates = [0.5, 1.0, 1.5, 2.0]
    found = goodput_from_sweep(rates, [synthetic_attainment(r) for r in rates])
    assert found.rps == pytest.approx(1.2) and found.bracket == (1.0, 1.5)
    # a noisy curve: a lucky point after the first failure does not raise the goodput
    assert goodput_from_sweep([1, 2, 3], [1.0, 0.5, 0.95]).rps == pytest.approx(1.2)
    assert goodput_from_sweep([1, 2], [0.5, 0.2]) == (0.0, (0.0, 1), True, False)
    assert goodput_from_sweep([1, 2], [1.0, 0.95]).above_range
    assert goodput_from_sweep([1, 2], [1.0, math.nan]).rps == pytest.approx(1.1)  # a run without requests fails


def test_goodput_bisection_converges_on_the_synthetic_curve():
    calls = []

    def measure(rate: float) -> float:
        calls.append(rate)
        return synthetic_attainment(rate)

    result = bisect_goodput(measure, 0.5, 3.0, steps=8)
    assert result.goodput.rps == pytest.approx(1.2, abs=2.5 / 2**8)
    passing, failing = result.goodput.bracket
    assert synthetic_attainment(passing) >= ATTAINMENT_TARGET > synthetic_attainment(failing)
    assert calls == [p.rate for p in result.probes] and len(calls) == 2 + 8
    assert bisect_goodput(lambda r: 0.0, 1, 2, steps=3).goodput.below_range
    assert bisect_goodput(lambda r: 1.0, 1, 2, steps=3).goodput == (2, (2, 2), False, True)


def test_the_bandwidth_threshold_is_where_starving_first_fails():
    gbps = [10, 1, 0.5, 0.25]
    threshold = bandwidth_threshold(gbps, [1.0, 1.0, 0.8, 0.1])
    assert (threshold.last_passing_gbps, threshold.first_failing_gbps) == (1, 0.5)
    # linear in transfer time: 1/B = 1 + (2 - 1) * (1.0 - 0.9) / (1.0 - 0.8) = 1.5
    assert threshold.gbps == pytest.approx(1 / 1.5)
    assert bandwidth_threshold(gbps, [1.0] * 4).never_fails
    assert bandwidth_threshold(gbps, [0.2] * 4).always_fails
