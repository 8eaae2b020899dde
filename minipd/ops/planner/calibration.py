"""Calibrate a profile to published per-instance rates, and the single-pool goodputs it uses.

A lone prefill instance is measured as DistServe measures one: Poisson arrivals, TTFT only,
with decode free (zero cost, unlimited KV) and the link unlimited, so only prefill queueing
and compute show. A lone decode instance: prefill free, so prefilled requests reach decode
as a Poisson stream, and only the per-token objective counts.
"""

from __future__ import annotations

import math

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_model import DecodeModel, PrefillModel
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.sim_summary import summarize_sim
from minipd.ops.planner.simulator import Simulator
from minipd.ops.planner.workload_spec import WorkloadSpec
from minipd.policy.local_prefill import LocalPrefillThresholds
from minipd.slo.goodput import find_goodput
from minipd.slo.targets import SLO

FREE_PREFILL = PrefillModel(0.0, 0.0, 0.0)
FREE_DECODE = DecodeModel(0.0, 0.0, 0.0)
UNLIMITED_KV = 1 << 40


def _scaled(model, factor: float):
    return type(model)(model.a * factor, model.b * factor, model.c * factor)


def pool_goodput(
    profile: LatencyProfile, role: str, workload: WorkloadSpec, slo: SLO, target: float = 0.9, rel_tol: float = 0.01
) -> float:
    """Goodput (rps) of one instance of `role` ("prefill" or "decode") on its own."""
    if role == "prefill":
        lone = profile.replace(decode=FREE_DECODE, kv_capacity_tokens=UNLIMITED_KV)
        lone_slo = SLO(ttft_s=slo.ttft_s)
        start = 1 / profile.prefill.prompt_s(round(workload.mean_lengths()[0]))
    elif role == "decode":
        lone = profile.replace(prefill=FREE_PREFILL)
        kind, bound = slo.decode_bound
        lone_slo = SLO(**{f"{kind}_s": bound})
        start = 1.0
    else:
        raise ValueError(f"role: expected 'prefill' or 'decode', got {role!r}")
    options = SimOptions(
        link=KVLink(math.inf, 0.0, True, profile.num_layers), local_prefill=LocalPrefillThresholds(max_local_tokens=0)
    )
    sim = Simulator(lone, ClusterSpec.split(1, 1), options)

    def specs(rate: float):
        made = workload.make(rate)
        # With decode free, output lengths cannot change a prefill instance's TTFT: one token
        # each spares the simulator every (free) decode step.
        return [s._replace(output_len=1) for s in made] if role == "prefill" else made

    return find_goodput(
        lambda rate: summarize_sim(sim.run(specs(rate)), lone_slo).attainment, start, target, rel_tol
    ).rate_rps


def calibrate_phase(
    profile: LatencyProfile, role: str, target_rps: float, workload: WorkloadSpec, slo: SLO, rel_tol: float = 0.005
) -> tuple[LatencyProfile, float]:
    """Scale `role`'s three coefficients by one factor so that its lone-instance goodput is
    `target_rps`; returns the scaled profile and the factor (bisection on log(factor),
    goodput falling as the factor grows)."""

    def with_factor(factor: float) -> LatencyProfile:
        return profile.replace(**{role: _scaled(getattr(profile, role), factor)})

    lo, hi = 1.0, 1.0
    while pool_goodput(with_factor(lo), role, workload, slo) < target_rps:
        lo /= 2
    while pool_goodput(with_factor(hi), role, workload, slo) > target_rps:
        hi *= 2
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if pool_goodput(with_factor(mid), role, workload, slo) > target_rps:
            lo = mid
        else:
            hi = mid
    factor = math.sqrt(lo * hi)
    return with_factor(factor), factor


def scale_phases(profile: LatencyProfile, prefill_factor: float, decode_factor: float) -> LatencyProfile:
    """Every prefill coefficient times `prefill_factor`, every decode one times `decode_factor`."""
    return profile.replace(
        prefill=_scaled(profile.prefill, prefill_factor), decode=_scaled(profile.decode, decode_factor)
    )
