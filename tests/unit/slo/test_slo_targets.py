"""minipd.slo: an SLO is written in milliseconds (`--goodput` syntax) and held in seconds; which
requests meet it; latency statistics. The vocabulary the router, simulator and load generator share."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from minipd.slo.attainment import attainment, meets
from minipd.slo.histogram import LogHistogram
from minipd.slo.latency import LatencyStats
from minipd.slo.targets import SLO


def test_the_goodput_syntax_is_milliseconds_and_the_slo_holds_seconds():
    slo = SLO.parse(["ttft:2000", "tpot:50", "itl:40", "e2e:9000"])
    assert (slo.ttft_s, slo.tpot_s, slo.itl_s, slo.e2e_s) == (2.0, 0.05, 0.04, 9.0)
    assert slo.items() == ["ttft:2000", "tpot:50", "itl:40", "e2el:9000"]  # back in flag order, e2e as e2el
    assert SLO.parse(slo.items()) == slo
    assert slo.as_ms() == {"ttft_ms": 2000, "tpot_ms": 50, "itl_ms": 40, "e2el_ms": 9000}  # the JSON's form
    assert slo.describe() == "ttft:2000ms tpot:50ms itl:40ms e2el:9000ms"
    assert str(SLO()) == "none" and SLO().is_empty and not slo.is_empty
    assert msgspec.convert(msgspec.to_builtins(slo), SLO) == slo


@pytest.mark.parametrize(
    "items, words",
    [
        (["foo:5"], "KEY:MILLISECONDS"),
        (["ttft"], "KEY:MILLISECONDS"),
        (["ttft:fast"], "not a number"),
        (["ttft:1", "ttft:2"], "twice"),
        (["tpot:-1"], "positive"),
        (["e2el:inf"], "positive"),
    ],
)
def test_bad_items_are_named(items, words):
    with pytest.raises(ValueError, match=words):
        SLO.parse(items)


def test_the_decode_bound_prefers_itl_over_tpot():
    assert SLO.parse(["ttft:1", "tpot:50", "itl:40"]).decode_bound == ("itl", 0.04)
    assert SLO.parse(["tpot:50"]).decode_bound == ("tpot", 0.05)
    assert SLO.parse(["ttft:1"]).decode_bound is None


def test_a_request_meets_an_slo_when_every_bound_holds_and_nan_meets_trivially():
    slo = SLO.parse(["ttft:150", "tpot:20"])
    good = meets(
        slo,
        ttft_s=[0.1, 0.2, 0.1, 0.15],
        tpot_s=[0.01, 0.01, 0.03, math.nan],  # the last has one output token: no TPOT
        itl_s=[1.0] * 4,  # not bounded
        e2e_s=[9.0] * 4,
    )
    assert good.tolist() == [True, False, False, True]
    assert attainment(good) == 0.5 and math.isnan(attainment([]))


def test_latency_stats_leave_out_nan_and_match_numpy():
    values = np.array([0.3, 0.1, math.nan, 0.2, 0.4])
    stats = LatencyStats.of(values)
    finite = values[~np.isnan(values)]
    assert stats.count == 4 and stats.mean == pytest.approx(0.25) and stats.median == stats.p50 == pytest.approx(0.25)
    assert stats.p90 == pytest.approx(np.percentile(finite, 90)) and stats.std == pytest.approx(finite.std())
    assert LatencyStats.of([]).count == 0 and math.isnan(LatencyStats.of([]).p99)


def test_latency_stats_of_a_histogram_have_its_percentiles_and_no_mean():
    histogram = LogHistogram(rel_width=0.001)
    histogram.add(np.linspace(0.01, 0.1, 1000))
    stats = LatencyStats.of_histogram(histogram)
    assert stats.count == 1000 and math.isnan(stats.mean)
    assert stats.p90 == pytest.approx(0.091, rel=0.002)
