"""The planner: which split of N instances serves a workload best under its SLOs?

Candidates are all-colocated (chunked prefill, trying each chunk budget given) and every
P:D with P + D = N, P, D >= 1 (trying each local-prefill threshold given). Each candidate's
goodput is searched by simulation (`find_goodput`); the winner has the highest goodput.
Every candidate is then simulated once more at one common *evaluated rate* (by default
`EVAL_FRACTION` of the winner's goodput), which gives the table's P90 TTFT, P90 ITL and
attainment and the green zone: a split is green when it meets the SLOs for at least the
target fraction of requests at that rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.sim_summary import SimSummary, summarize_sim
from minipd.ops.planner.simulator import Simulator
from minipd.ops.planner.workload_spec import WorkloadSpec
from minipd.policy.local_prefill import LocalPrefillThresholds
from minipd.slo.goodput import find_goodput
from minipd.slo.targets import SLO

# Evaluate every split just below the winner's goodput, where the winner meets its SLOs with
# a little room; at exactly its goodput it would sit on the 90% line by construction.
EVAL_FRACTION = 0.9
START_FRACTION = 0.5  # the goodput search starts at this fraction of the rough capacity estimate
# Chunk budgets colocated instances are tried with (with the profile's own), so that colocated
# competes with its best setting: small chunks protect ITL, large ones TTFT.
COLOCATED_BUDGETS = (512, 2048)
MIN_SPAN_LIFETIMES = 5


class PlanConfig(msgspec.Struct, frozen=True, kw_only=True):
    profile: LatencyProfile
    num_instances: int
    workload: WorkloadSpec
    slo: SLO
    link: KVLink
    local_prefill: tuple[LocalPrefillThresholds, ...] = (LocalPrefillThresholds(),)
    colocated_budgets: tuple[int, ...] = ()  # empty: COLOCATED_BUDGETS and the profile's budget
    colocated_scheduling: str = "chunked"  # or "prefill-first"; see SimOptions
    requests_per_instance: int | None = None  # set: each run has this many requests per instance
    eval_rate_rps: float | None = None  # None: EVAL_FRACTION of the winner's goodput
    target: float = 0.9
    rel_tol: float = 0.02

    def __post_init__(self) -> None:
        if self.num_instances < 1:
            raise ValueError(f"num_instances: must be >= 1, got {self.num_instances}")
        if self.slo.is_empty:
            raise ValueError("slo: give at least one objective (ttft, tpot, itl or e2el)")
        if not self.local_prefill:
            raise ValueError("local_prefill: give at least one threshold setting")
        if self.eval_rate_rps is not None and not self.eval_rate_rps > 0:
            raise ValueError(f"rate: must be positive, got {self.eval_rate_rps}")

    def workload_for(self, cluster: ClusterSpec) -> WorkloadSpec:
        if self.requests_per_instance is None:
            return self.workload
        return msgspec.structs.replace(self.workload, num_requests=self.requests_per_instance * cluster.size)


class SplitResult(msgspec.Struct, frozen=True):
    label: str
    num_prefill: int
    num_decode: int
    num_colocated: int
    setting: str  # the local-prefill threshold or chunk budget that gave the best goodput
    goodput_rps: float
    goodput_per_instance: float
    eval_rate_rps: float
    eval: SimSummary  # at eval_rate_rps
    meets_slo: bool  # eval.attainment >= target


class Plan(msgspec.Struct, frozen=True):
    profile: str
    num_instances: int
    slo: str
    link_gbps: float | None  # None: unlimited
    workload: WorkloadSpec
    target: float
    eval_rate_rps: float
    splits: list[SplitResult]
    best: str  # label of the winner
    best_goodput_per_instance: float


def candidate_clusters(n: int) -> list[ClusterSpec]:
    return [ClusterSpec.colocated(n)] + [ClusterSpec.split(p, n - p) for p in range(1, n)]


def options_for(config: PlanConfig, cluster: ClusterSpec) -> list[tuple[str, SimOptions]]:
    """The settings a candidate is tried with, each with a label."""
    if cluster.num_colocated:
        budgets = config.colocated_budgets or sorted({*COLOCATED_BUDGETS, config.profile.max_batched_tokens})
        return [
            (
                f"chunk {b}",
                SimOptions(
                    link=config.link, colocated_batched_tokens=b, colocated_scheduling=config.colocated_scheduling
                ),
            )
            for b in budgets
        ]
    return [(_threshold_label(t), SimOptions(link=config.link, local_prefill=t)) for t in config.local_prefill]


def _threshold_label(t: LocalPrefillThresholds) -> str:
    label = f"local<={t.max_local_tokens}"
    if t.prefill_busy_tokens is not None:
        label += f", busy>{t.prefill_busy_tokens}tok"
    if t.prefill_busy_requests is not None:
        label += f", busy>{t.prefill_busy_requests}req"
    return label


def run_at(config: PlanConfig, cluster: ClusterSpec, options: SimOptions, rate_rps: float) -> SimSummary:
    specs = requests_for(config, cluster).make(rate_rps)
    return summarize_sim(Simulator(config.profile, cluster, options).run(specs), config.slo)


class RequestCosts(NamedTuple):
    prefill_s: float  # one mean prompt alone
    decode_step_s: float  # a decode step at the largest batch that fits
    batch: int
    output_len: float


def request_costs(profile: LatencyProfile, workload: WorkloadSpec) -> RequestCosts:
    prompt, output = workload.mean_lengths()
    batch = max(1, min(profile.max_num_seqs, profile.kv_capacity_tokens // max(1, round(prompt + output))))
    step = profile.decode.step_s(round(batch * (prompt + output / 2)), batch)
    return RequestCosts(profile.prefill.prompt_s(round(prompt)), step, batch, output)


def capacity_estimate(profile: LatencyProfile, workload: WorkloadSpec, cluster: ClusterSpec) -> float:
    """A rough requests/s the cluster can serve, only to start the goodput search nearby."""
    costs = request_costs(profile, workload)
    decode_s = (costs.output_len - 1) * costs.decode_step_s / costs.batch  # instance-seconds per request
    if cluster.num_colocated:
        return cluster.num_colocated / (costs.prefill_s + decode_s)
    decode_rate = cluster.num_decode / max(decode_s, 1e-9)
    return min(cluster.num_prefill / costs.prefill_s, decode_rate) if cluster.num_prefill else decode_rate / 2


def requests_for(config: PlanConfig, cluster: ClusterSpec) -> WorkloadSpec:
    """The workload of one run: as configured, but long enough that arrivals span at least
    MIN_SPAN_LIFETIMES request lifetimes at the cluster's rough capacity, so that the run
    reaches a steady state (a run shorter than one request's life never sees full load)."""
    workload = config.workload_for(cluster)
    costs = request_costs(config.profile, workload)
    lifetime = costs.prefill_s + (costs.output_len - 1) * costs.decode_step_s
    needed = math.ceil(MIN_SPAN_LIFETIMES * lifetime * capacity_estimate(config.profile, workload, cluster))
    if needed <= workload.num_requests:
        return workload
    return msgspec.structs.replace(workload, num_requests=needed)


def best_goodput(config: PlanConfig, cluster: ClusterSpec) -> tuple[str, SimOptions, float]:
    """(setting label, options, goodput rps) of the candidate's best setting."""
    start = START_FRACTION * capacity_estimate(config.profile, config.workload_for(cluster), cluster)
    best = None
    for label, options in options_for(config, cluster):
        found = find_goodput(
            lambda r, o=options: run_at(config, cluster, o, r).attainment, start, config.target, config.rel_tol
        )
        if best is None or found.rate_rps > best[2]:
            best = (label, options, found.rate_rps)
    return best


def plan(config: PlanConfig, clusters: Sequence[ClusterSpec] | None = None) -> Plan:
    clusters = list(clusters) if clusters is not None else candidate_clusters(config.num_instances)
    found = [(cluster, *best_goodput(config, cluster)) for cluster in clusters]
    winner = max(found, key=lambda f: f[3])
    eval_rate = config.eval_rate_rps or EVAL_FRACTION * winner[3]
    if not eval_rate > 0:
        raise ValueError("plan: no split meets the SLOs at any rate tried; relax the SLOs or check the profile")
    splits = []
    for cluster, label, options, goodput in found:
        summary = run_at(config, cluster, options, eval_rate)
        splits.append(
            SplitResult(
                label=cluster.label,
                num_prefill=cluster.num_prefill,
                num_decode=cluster.num_decode,
                num_colocated=cluster.num_colocated,
                setting=label,
                goodput_rps=goodput,
                goodput_per_instance=goodput / cluster.size,
                eval_rate_rps=eval_rate,
                eval=summary,
                meets_slo=summary.attainment >= config.target,
            )
        )
    best = max(splits, key=lambda s: s.goodput_rps)
    return Plan(
        profile=config.profile.name,
        num_instances=config.num_instances,
        slo=config.slo.describe(),
        link_gbps=None if math.isinf(config.link.gbps) else config.link.gbps,
        workload=config.workload,
        target=config.target,
        eval_rate_rps=eval_rate,
        splits=splits,
        best=best.label,
        best_goodput_per_instance=best.goodput_per_instance,
    )
