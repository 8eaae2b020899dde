"""The serving path's fixed per-request cost, probed on the idle cluster.

The step models (fitted to the instances' own steps, minipd.ops.planner.step_log_fit) hold what
a request pays inside the instances; what it pays outside them (the HTTP front, tokenization,
the router's hop and control calls, the first token's relay back) is a fixed latency the
simulator adds before admission (`SimOptions.request_overhead_s`). The probe measures it
with `PROBE_REQUESTS` requests sent one at a time (each alone on the cluster: no queueing, no
batching): their median TTFT less the simulated one (prefill of the prompt and the exposed
KV transfer, at the speed the machine ran during the probe, when `speed` says). A lone
request's first gap (first token to second) is one decode step in the simulator, like every
later gap; measured, it also holds the hop from the prefill instance's first token to the
decode instance's batch (the router passes the token on, the decode instance takes the
request in). Its median less the later gaps' median is that hop
(`SimOptions.decode_join_delay_s`). The median token gap against the simulated one is
reported beside them, as a check of the decode model at batch 1.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import NamedTuple

import msgspec
import numpy as np

from benchmarks.loadgen.deployments import Deployment
from benchmarks.loadgen.measure import MS_PER_S, measure
from minipd.ops.loadgen.runner import RunResult
from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.simulator import Simulator
from minipd.ops.planner.step_jitter import SpeedTrace
from minipd.ops.workload import RequestSpec

PROBE_REQUESTS = 8
PROBE_PROMPT_LEN = 32
PROBE_OUTPUT_LEN = 48
PROBE_SPACING_S = 2.0  # well past one probe's end-to-end time, so each runs alone


class Probe(NamedTuple):
    request_overhead_s: float
    decode_join_delay_s: float
    measured_ttft_p50_ms: float
    simulated_ttft_p50_ms: float
    measured_gap_p50_ms: float
    simulated_gap_p50_ms: float
    measured_first_gap_p50_ms: float  # first token to second: the hop to the decode instance, and a step

    def apply(self, options: SimOptions) -> SimOptions:
        return msgspec.structs.replace(
            options, request_overhead_s=self.request_overhead_s, decode_join_delay_s=self.decode_join_delay_s
        )

    def as_json(self) -> dict:
        return {
            "requests": PROBE_REQUESTS,
            "prompt_len": PROBE_PROMPT_LEN,
            "output_len": PROBE_OUTPUT_LEN,
            "measured_ttft_p50_ms": self.measured_ttft_p50_ms,
            "simulated_ttft_p50_ms": self.simulated_ttft_p50_ms,
            "measured_gap_p50_ms": self.measured_gap_p50_ms,
            "simulated_gap_p50_ms": self.simulated_gap_p50_ms,
            "measured_first_gap_p50_ms": self.measured_first_gap_p50_ms,
            "request_overhead_ms": self.request_overhead_s * MS_PER_S,
            "decode_join_delay_ms": self.decode_join_delay_s * MS_PER_S,
        }


def probe_specs(num: int = PROBE_REQUESTS) -> list[RequestSpec]:
    return [RequestSpec(i * PROBE_SPACING_S, PROBE_PROMPT_LEN, PROBE_OUTPUT_LEN) for i in range(num)]


def probe(
    deployment: Deployment,
    profile: LatencyProfile,
    options: SimOptions,
    builder,
    config,
    tag: str,
    speed: Callable[[RunResult], SpeedTrace] | None = None,
) -> Probe:
    """Measure the probe on `deployment` and derive the overhead against the simulator run
    with `profile` and `options` (whose own `request_overhead_s` is ignored), and with the
    speed trace `speed` gives for the probe's run."""
    specs = probe_specs()
    run = measure(deployment.urls, specs, builder, tag, config).result
    records = [r for r in run.records if r.success]
    if len(records) < len(specs) // 2:
        raise RuntimeError(f"validate probe: only {len(records)} of {len(specs)} probe requests succeeded")
    trace = speed(run) if speed is not None else options.speed_trace
    plain = msgspec.structs.replace(options, request_overhead_s=0.0, decode_join_delay_s=0.0, speed_trace=trace)
    sim = Simulator(profile, ClusterSpec.split(1, 1), plain).run(specs)
    ttft = statistics.median(r.ttft_s for r in records)
    sim_ttft = float(np.median(sim.ttft_s))
    gap = statistics.median(g for r in records for g in r.itl_s)
    first_gap = statistics.median(r.itl_s[0] for r in records)
    later_gap = statistics.median(g for r in records for g in r.itl_s[1:])
    sim_gap = sim.itl_gaps.percentile(50)
    return Probe(
        request_overhead_s=max(0.0, ttft - sim_ttft),
        decode_join_delay_s=max(0.0, first_gap - later_gap),
        measured_first_gap_p50_ms=first_gap * MS_PER_S,
        measured_ttft_p50_ms=ttft * MS_PER_S,
        simulated_ttft_p50_ms=sim_ttft * MS_PER_S,
        measured_gap_p50_ms=gap * MS_PER_S,
        simulated_gap_p50_ms=sim_gap * MS_PER_S,
    )
