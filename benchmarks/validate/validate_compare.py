"""validate's comparison: the figures compared (`METRICS`: TTFT and token-gap percentiles, in
milliseconds as the JSON holds them) of simulated and measured requests, the targets
(latencies within 15%, attainment within 5 points) and a workload's runs pooled.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from benchmarks.loadgen.measure import MS_PER_S
from minipd.ops.loadgen.records import RequestRecord
from minipd.ops.planner.sim_result import SimResult
from minipd.slo.histogram import LogHistogram
from minipd.slo.latency import percentile

LATENCY_TOLERANCE = 0.15
ATTAINMENT_TOLERANCE = 0.05
FLOAT_MARGIN = 1e-9
METRICS = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms")
JITTER_SEEDS = 5  # the predicted simulation's figures are medians over this many jitter draws


def _figures(ttft_s, gap_percentile: Callable[[float], float]) -> dict:
    """`METRICS` (milliseconds, the JSON's unit) of requests' TTFTs and token gaps (seconds)."""
    return {
        "ttft_p50_ms": percentile(ttft_s, 50) * MS_PER_S,
        "ttft_p90_ms": percentile(ttft_s, 90) * MS_PER_S,
        "itl_p50_ms": gap_percentile(50) * MS_PER_S,
        "itl_p90_ms": gap_percentile(90) * MS_PER_S,
    }


def simulated_figures(ttft_s: np.ndarray, gaps: LogHistogram) -> dict:
    """`METRICS` of simulated requests: their TTFTs and every token gap."""
    return _figures(ttft_s, gaps.percentile)


def measured_figures(records) -> dict:
    """`METRICS` of the successful ones of measured `records`."""
    ok = [r for r in records if r.success]
    gaps = [g for r in ok for g in r.itl_s]
    return _figures([r.ttft_s for r in ok], lambda p: percentile(gaps, p))


def within(error: float, tolerance: float) -> bool:
    """|error| <= tolerance, up to float rounding: 80 requests move attainment in steps of
    1.25 points, and a difference of exactly 5 points is within 5."""
    return abs(error) <= tolerance + FLOAT_MARGIN


def compare(sim: dict, meas: dict) -> dict:
    errors = {m: (sim[m] - meas[m]) / meas[m] if meas[m] else math.nan for m in METRICS}
    attain = sim["attainment"] - meas["attainment"]
    ok = all(within(e, LATENCY_TOLERANCE) for e in errors.values()) and within(attain, ATTAINMENT_TOLERANCE)
    return {"relative_error": errors, "attainment_diff": attain, "within_targets": ok}


class Pooled(NamedTuple):
    """One run's simulated and measured requests, kept to pool a workload's runs."""

    sim: SimResult
    sim_attainment: float
    records: list[RequestRecord]
    attainment: float


def pool(runs: list[Pooled]) -> dict:
    """The comparison over every request of a workload's runs together (each judged against
    its own run's SLO): percentiles of all of them, and attainment as the share of all."""
    gaps = LogHistogram()
    for r in runs:
        gaps.add_histogram(r.sim.itl_gaps)
    n_sim = [r.sim.num_requests for r in runs]
    n_meas = [len(r.records) for r in runs]
    sim = {
        **simulated_figures(np.concatenate([r.sim.ttft_s for r in runs]), gaps),
        "attainment": float(np.average([r.sim_attainment for r in runs], weights=n_sim)),
    }
    meas = {
        **measured_figures([rec for r in runs for rec in r.records]),
        "attainment": float(np.average([r.attainment for r in runs], weights=n_meas)),
    }
    return {"num_requests": sum(n_meas), "simulated": sim, "measured": meas, **compare(sim, meas)}
