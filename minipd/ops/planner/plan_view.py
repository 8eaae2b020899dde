"""What the dashboard's Plan view and its live prediction show, answered by the simulator.

Both run in the plan worker (`plan_worker.py`), never in the router. Every figure comes from
`Simulator` runs summarized by `summarize_sim` (the planner's own functions), one run per
(profile, split, link, workload, rate, SLO), each cached (`SimCache`) so that moving one input
re-simulates only what it changes.

- `plan_answer(request)`: every split of N instances (all colocated, every P:D) at one rate:
  P90 TTFT and ITL and attainment per split (the green zone: those meeting both SLOs for at
  least `target` of requests); the chosen split's P50/P90/P99; KV per request and its transfer
  time over the chosen link; and where the link becomes the bottleneck: the bandwidth below
  which the chosen split's P90 TTFT misses its SLO, found by bisection on a log scale, each
  probe a simulation.
- `predict_answer(request)`: one simulated run of the live cluster's split at its measured
  arrival rate, lengths drawn from its measured (prompt, output) pairs.
Inputs arrive as the plain dicts of the worker protocol, checked by the router side first;
anything still wrong raises `ValueError` starting with the field's name.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import OrderedDict

import numpy as np

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.planner import candidate_clusters
from minipd.ops.planner.profiles import BUILTIN, builtin_profile
from minipd.ops.planner.sim_summary import summarize_sim
from minipd.ops.planner.simulator import Simulator
from minipd.ops.planner.workload_spec import WorkloadSpec
from minipd.ops.workload import ArrivalProcess, RequestSpec, arrival_times
from minipd.slo.targets import SLO

CACHE_SIZE = 4096  # simulated runs kept (each a few hundred bytes of figures)
UNLIMITED_LINK_GBPS = 10_000.0  # the top of the bandwidth search when the link is unlimited
LOWEST_LINK_GBPS = 1e-3
LINK_PROBES = 6  # bisection steps on log(bandwidth): the bracket narrows 2**6-fold in log space


class SimCache:
    """Figures of simulated runs by their inputs, least recently used dropped beyond `size`."""

    def __init__(self, size: int = CACHE_SIZE):
        self.size, self.runs = size, OrderedDict()
        self.hits = self.misses = 0

    def get(self, key, compute):
        if key in self.runs:
            self.hits += 1
            self.runs.move_to_end(key)
            return self.runs[key]
        self.misses += 1
        value = self.runs[key] = compute()
        if len(self.runs) > self.size:
            self.runs.popitem(last=False)
        return value


CACHE = SimCache()
_PROFILES: dict[str, LatencyProfile] = {}  # profile JSON digest -> parsed profile


def load_profile(spec: dict) -> tuple[str, LatencyProfile]:
    """(cache key, profile) of `{"builtin": NAME}` or `{"json": PROFILE}` (a LatencyProfile as
    `bench.py profile` writes it)."""
    if "builtin" in spec:
        name = spec["builtin"]
        if name not in BUILTIN:
            raise ValueError(f"profile: unknown built-in {name!r}; choose one of {sorted(BUILTIN)}")
        key = "builtin:" + name
        if key not in _PROFILES:
            _PROFILES[key] = builtin_profile(name)
        return key, _PROFILES[key]
    text = spec.get("json")
    if not isinstance(text, str):
        raise ValueError("profile: give a built-in name or a latency profile's JSON")
    key = "json:" + hashlib.sha256(text.encode()).hexdigest()
    if key not in _PROFILES:
        _PROFILES[key] = LatencyProfile.from_json(text)  # ValueError "latency profile: ..." when bad
        if len(_PROFILES) > 64:
            _PROFILES.pop(next(iter(_PROFILES)))
    return key, _PROFILES[key]


def describe_profile(profile: LatencyProfile) -> dict:
    return {
        "name": profile.name,
        "model": profile.model,
        "dtype": profile.dtype,
        "device": profile.device,
        "threads": profile.threads,
        "tensor_parallel": profile.tensor_parallel,
        "source": profile.source,
        "kv_bytes_per_token": profile.kv_bytes_per_token,
        "link_gbps": None if math.isinf(profile.link_gbps) else profile.link_gbps,
    }


def _share_at_most(values: np.ndarray, bound: float) -> float | None:
    values = values[~np.isnan(values)]
    return float(np.mean(values <= bound)) if len(values) else None


def simulate(profile: LatencyProfile, cluster: ClusterSpec, link: KVLink, specs: list[RequestSpec], slo: SLO) -> dict:
    """One run's figures: TTFT and ITL (every gap) P50/P90/P99 in seconds, `attainment` (share
    of requests meeting both SLOs, the planner's), `ttft_share` (first tokens within the TTFT
    SLO) and `itl_share` (gaps within the ITL SLO), as the live window counts them."""
    result = Simulator(profile, cluster, SimOptions(link=link)).run(specs)
    summary = summarize_sim(result, slo)
    gaps = result.itl_gaps
    itl_share = gaps.fraction_at_most(slo.itl_s) if gaps.count else None
    return {
        "ttft": {f"p{p}": _finite(getattr(summary.ttft_s, f"p{p}")) for p in (50, 90, 99)},
        "itl": {f"p{p}": _finite(getattr(summary.itl_s, f"p{p}")) for p in (50, 90, 99)},
        "attainment": summary.attainment,
        "ttft_share": _share_at_most(result.ttft_s, slo.ttft_s),
        "itl_share": itl_share,
        "num_requests": summary.num_requests,
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class _Runner:
    """Cached runs of one plan request's profile, workload and SLO."""

    def __init__(self, profile_key: str, profile: LatencyProfile, workload: WorkloadSpec, rate: float, slo: SLO):
        self.profile_key, self.profile, self.workload, self.rate, self.slo = profile_key, profile, workload, rate, slo
        self._specs = None

    @property
    def specs(self) -> list[RequestSpec]:
        if self._specs is None:
            self._specs = self.workload.make(self.rate)
        return self._specs

    def link(self, gbps: float) -> KVLink:
        return KVLink(gbps, self.profile.link_setup_s, True, self.profile.num_layers)

    def run(self, cluster: ClusterSpec, gbps: float) -> dict:
        if cluster.num_colocated:
            gbps = math.inf  # no KV crosses a link: one run serves every bandwidth
        key = (self.profile_key, cluster, gbps, self.workload, self.rate, self.slo)
        return CACHE.get(key, lambda: simulate(self.profile, cluster, self.link(gbps), self.specs, self.slo))


def plan_answer(request: dict) -> dict:
    started = time.perf_counter()
    hits, misses = CACHE.hits, CACHE.misses
    profile_key, profile = load_profile(request["profile"])
    n, mode, num_prefill = request["num_instances"], request["mode"], request["num_prefill"]
    slo = SLO(ttft_s=request["ttft_ms"] / 1e3, itl_s=request["itl_ms"] / 1e3)
    target = request["target"]
    workload = WorkloadSpec(
        name=request["workload"],
        prompt_len=request.get("prompt_len"),
        output_len=request.get("output_len"),
        num_requests=request["num_requests"],
        seed=request.get("seed", 0),
    )
    gbps = request.get("link_gbps") or profile.link_gbps
    runner = _Runner(profile_key, profile, workload, request["rate_rps"], slo)
    specs = runner.specs
    for s in specs:
        if s.prompt_len + s.output_len > profile.kv_capacity_tokens:
            raise ValueError(
                f"prompt_len: a request of {s.prompt_len + s.output_len} tokens does not fit an instance's KV "
                f"({profile.kv_capacity_tokens} tokens in {profile.name})"
            )

    def bar(cluster: ClusterSpec) -> dict:
        figures = runner.run(cluster, gbps)
        meets_ttft = figures["ttft"]["p90"] is not None and figures["ttft"]["p90"] <= slo.ttft_s
        meets_itl = figures["itl"]["p90"] is None or figures["itl"]["p90"] <= slo.itl_s
        return {
            "label": cluster.label,
            "num_prefill": cluster.num_prefill,
            "num_decode": cluster.num_decode,
            "num_colocated": cluster.num_colocated,
            **figures,
            "meets_ttft": meets_ttft,
            "meets_itl": meets_itl,
            "green": figures["attainment"] >= target,
        }

    bars = [bar(c) for c in candidate_clusters(n)]
    chosen = (
        ClusterSpec.colocated(n) if mode == "colocated" or n == 1 else ClusterSpec.split(num_prefill, n - num_prefill)
    )
    selected = next(b for b in bars if b["label"] == chosen.label)
    prompt, _ = workload.mean_lengths()
    kv_bytes = prompt * profile.kv_bytes_per_token
    link = runner.link(gbps)
    # the link is judged on a split (the chosen one, or in colocated mode the P:D slider's)
    link_split = ClusterSpec.split(num_prefill, n - num_prefill) if n > 1 else None
    return {
        "profile": describe_profile(profile),
        "inputs": {"link_gbps": None if math.isinf(gbps) else gbps, "num_requests": workload.num_requests},
        "selected": selected,
        "verdict": "met" if selected["green"] else "violated",
        "kv": {
            "bytes_per_request": kv_bytes,
            "mean_prompt_tokens": prompt,
            "transfer_s": link.transfer_s(kv_bytes) + link.setup_s,
            "exposed_s": link.exposed_s(kv_bytes, profile.prefill.prompt_s(round(prompt))),
        },
        "bars": bars,
        "green_zone": [b["label"] for b in bars if b["green"]],
        "link": None
        if link_split is None or not request.get("link_search", True)
        else link_bottleneck(runner, link_split, gbps, slo),
        "timing": {
            "compute_s": time.perf_counter() - started,
            "simulations": CACHE.misses - misses,
            "cached": CACHE.hits - hits,
        },
    }


def link_bottleneck(runner: _Runner, cluster: ClusterSpec, gbps: float, slo: SLO) -> dict:
    """Where the KV link of `cluster` becomes the bottleneck: the bandwidth below which its P90
    TTFT misses the SLO (`breaks_below_gbps`, to within the bisection's bracket), searched from
    the link given (or UNLIMITED_LINK_GBPS) down to LOWEST_LINK_GBPS."""

    def meets(bw: float) -> bool:
        p90 = runner.run(cluster, bw)["ttft"]["p90"]
        return p90 is not None and p90 <= slo.ttft_s

    high = gbps if math.isfinite(gbps) else UNLIMITED_LINK_GBPS
    answer = {
        "split": cluster.label,
        "searched_gbps": [LOWEST_LINK_GBPS, high],
        "breaks_below_gbps": None,
        "probes": LINK_PROBES + 2,
    }
    if not meets(high):
        return answer | {"state": "ttft misses its SLO even at this bandwidth: the link is not what breaks it"}
    if meets(LOWEST_LINK_GBPS):
        return answer | {"state": f"ttft meets its SLO down to {LOWEST_LINK_GBPS:g} Gbit/s: the link never breaks it"}
    lo, hi = math.log(LOWEST_LINK_GBPS), math.log(high)
    for _ in range(LINK_PROBES):
        mid = (lo + hi) / 2
        if meets(math.exp(mid)):
            hi = mid
        else:
            lo = mid
    return answer | {"state": "found", "breaks_below_gbps": math.exp(hi), "fails_at_gbps": math.exp(lo)}


def profiles_answer(request: dict) -> dict:
    """The built-in profiles' names, and the description of `flag` (a profile spec) if given."""
    flag = request.get("flag")
    return {"builtin": sorted(BUILTIN), "flag": describe_profile(load_profile(flag)[1]) if flag else None}


def predict_answer(request: dict) -> dict:
    """The live cluster's split at its measured rate and lengths; `fits: false` with a reason
    when the profile was measured on another model or device than the cluster's."""
    _, profile = load_profile(request["profile"])
    described = describe_profile(profile)
    model, device = request.get("cluster_model"), request.get("cluster_device")
    if model and profile.model != model:
        return {
            "fits": False,
            "profile": described,
            "reason": f"the profile is of {profile.model}, the cluster serves {model}",
        }
    if device and not profile.device.startswith(device):
        return {
            "fits": False,
            "profile": described,
            "reason": f"the profile was measured on {profile.device}, the cluster computes on {device}",
        }
    counts = request["cluster"]
    cluster = ClusterSpec(counts["prefill"], counts["decode"], counts["colocated"])  # ValueError "cluster: ..."
    rng = random.Random(request.get("seed", 0))
    pairs = request["lengths"]
    times = arrival_times(ArrivalProcess.poisson(request["rate_rps"]), request["num_requests"], rng)
    specs = [RequestSpec(t, *rng.choice(pairs)) for t in times]
    slo = SLO(ttft_s=request["ttft_ms"] / 1e3, itl_s=request["itl_ms"] / 1e3)
    for s in specs:
        if s.prompt_len + s.output_len > profile.kv_capacity_tokens:
            raise ValueError(f"lengths: {s.prompt_len + s.output_len} tokens do not fit the profile's KV")
    started = time.perf_counter()
    link = KVLink(request.get("link_gbps") or profile.link_gbps, profile.link_setup_s, True, profile.num_layers)
    figures = simulate(profile, cluster, link, specs, slo)
    return {
        "fits": True,
        "profile": described,
        "split": cluster.label,
        **figures,
        "compute_s": time.perf_counter() - started,
    }
