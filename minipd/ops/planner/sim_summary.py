"""Aggregate figures of one simulated run: percentiles, SLO attainment, good requests/s."""

from __future__ import annotations

import math

import msgspec
import numpy as np

from minipd.ops.planner.sim_request import Mode
from minipd.ops.planner.sim_result import SimResult
from minipd.slo.attainment import meets
from minipd.slo.latency import LatencyStats
from minipd.slo.targets import SLO


class SimSummary(msgspec.Struct, frozen=True):
    num_requests: int
    offered_rps: float  # arrivals per second over the arrival span
    duration_s: float  # first arrival to last token
    throughput_rps: float
    output_tokens_per_s: float
    ttft_s: LatencyStats
    tpot_s: LatencyStats
    itl_s: LatencyStats  # over every inter-token gap of every request (mean is nan: not tracked)
    request_itl_s: LatencyStats  # over requests, of each request's own P90 gap (what the itl SLO checks)
    e2e_s: LatencyStats
    attainment: float  # fraction of requests meeting every SLO
    good_rps: float  # good requests per second of the run
    local_prefill_fraction: float  # disaggregated runs: prompts prefilled on their decode instance


def good_requests(result: SimResult, slo: SLO) -> np.ndarray:
    """Per simulated request: does it meet every objective of `slo`?"""
    return meets(slo, ttft_s=result.ttft_s, tpot_s=result.tpot_s, itl_s=result.itl_p90_s, e2e_s=result.e2e_s)


def summarize_sim(result: SimResult, slo: SLO) -> SimSummary:
    n = result.num_requests
    if n == 0:
        raise ValueError("summarize: the run has no requests")
    span = float(result.arrival_s[-1] - result.arrival_s[0])
    duration = result.duration_s
    good = good_requests(result, slo)
    disaggregated = result.mode != Mode.COLOCATED
    local = float(np.mean(result.mode[disaggregated] == Mode.LOCAL)) if disaggregated.any() else 0.0
    return SimSummary(
        num_requests=n,
        offered_rps=(n - 1) / span if span > 0 else math.inf,
        duration_s=duration,
        throughput_rps=n / duration if duration > 0 else math.inf,
        output_tokens_per_s=float(result.output_len.sum()) / duration if duration > 0 else math.inf,
        ttft_s=LatencyStats.of(result.ttft_s),
        tpot_s=LatencyStats.of(result.tpot_s),
        itl_s=LatencyStats.of_histogram(result.itl_gaps),
        request_itl_s=LatencyStats.of(result.itl_p90_s),
        e2e_s=LatencyStats.of(result.e2e_s),
        attainment=float(good.mean()),
        good_rps=float(good.sum()) / duration if duration > 0 else math.inf,
        local_prefill_fraction=local,
    )
