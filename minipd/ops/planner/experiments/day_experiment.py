"""A day on a large cluster: a fixed P:D ratio against the ratio controller.

1. For each of the day's shapes alone, plan the best split on a small cluster
   (`plan_instances`): its prefill fraction and goodput per instance.
2. Build the day (`day_workload`): each hour's rate is its load x that goodput x N.
3. The fixed ratio is the one a planner would provision for the whole day: the prefill
   fraction of each hour's best split, weighted by the hour's request count, times N.
4. Simulate the day with that ratio fixed, and again starting from it in each other mode
   asked for: a `RatioController` moving instances between roles ("switch"), adding and
   removing instances instead ("scale", sim_scaling.py), or both; compare attainment per
   hour and per window, and the GPU-hours each held.
"""

from __future__ import annotations

import msgspec
import numpy as np

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.experiments.day_workload import HOURS, Hour, Shape, day_hours, make_day, shape_workload
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.planner import PlanConfig, plan
from minipd.ops.planner.sim_result import SimResult, held_seconds
from minipd.ops.planner.sim_scaling import SimScaling
from minipd.ops.planner.sim_summary import good_requests
from minipd.ops.planner.simulator import Simulator
from minipd.policy.pool_scaling import PoolBounds, ScalingConfig
from minipd.policy.ratio_controller import ControllerConfig, Move, RatioController
from minipd.slo.targets import SLO

PLAN_REQUESTS_PER_INSTANCE = 150
DAY_MODES = ("fixed", "switch", "scale", "both")
DEFAULT_MODES = ("fixed", "switch")
SCALING_MODES = ("scale", "both")


class ShapePlan(msgspec.Struct, frozen=True):
    shape: str
    best_split: str
    prefill_fraction: float
    goodput_per_instance: float


class HourStats(msgspec.Struct, frozen=True):
    hour: int
    shape: str
    rate_rps: float
    attainment: dict[str, float]  # per mode
    prefill: dict[str, int]  # per mode: prefill instances serving at the end of the hour
    held: dict[str, float]  # per mode: mean instances held over the hour


class WindowStats(msgspec.Struct, frozen=True):
    start_s: float
    ttft_attainment: float
    decode_attainment: float


class DayMode(msgspec.Struct, frozen=True):
    """One way of running the day (`DAY_MODES`)."""

    name: str
    attainment: float
    # day hours (each `seconds_per_hour` simulated) x instances held, over the day's hours (a
    # backlog drained after the last hour is not counted)
    instance_hours: float
    gpu_hours: float  # instance_hours x the profile's GPUs per instance
    num_moves: int  # role switches
    num_added: int
    num_removed: int
    windows: list[WindowStats]
    roles: list[tuple[float, int, int, int, int, int]]  # (time, prefill, decode, switching, starting, removing)
    events: list[tuple[float, str, str, str]]  # (time, action, role, reason): switches, adds, removes


class DayResult(msgspec.Struct, frozen=True):
    profile: str
    num_instances: int  # the fixed cluster's size, and the scaling modes' capacity
    gpus_per_instance: int
    seconds_per_hour: float
    slo: str
    shapes: list[ShapePlan]
    fixed_prefill: int
    num_requests: int
    hours: list[HourStats]
    window_s: float
    startup_delay_s: float  # scaling modes: from an add to serving
    modes: list[DayMode]

    def mode(self, name: str) -> DayMode:
        return next(m for m in self.modes if m.name == name)


def plan_shapes(
    profile: LatencyProfile, slo: SLO, link: KVLink, plan_instances: int, shapes: list[Shape]
) -> list[ShapePlan]:
    plans = []
    for shape in shapes:
        config = PlanConfig(
            profile=profile,
            num_instances=plan_instances,
            workload=shape_workload(shape, 1),
            slo=slo,
            link=link,
            requests_per_instance=PLAN_REQUESTS_PER_INSTANCE,
        )
        result = plan(config, [ClusterSpec.split(p, plan_instances - p) for p in range(1, plan_instances)])
        best = next(s for s in result.splits if s.label == result.best)
        plans.append(ShapePlan(shape.name, best.label, best.num_prefill / plan_instances, best.goodput_per_instance))
    return plans


def _attainment(result: SimResult, slo: SLO, mask: np.ndarray) -> float:
    return float(good_requests(result, slo)[mask].mean()) if mask.any() else float("nan")


def _windows(result: SimResult, slo: SLO, window_s: float, end_s: float) -> list[WindowStats]:
    kind, bound = slo.decode_bound
    ttft_ok = np.nan_to_num(result.ttft_s, nan=np.inf) <= slo.ttft_s
    per_token = result.itl_p90_s if kind == "itl" else result.tpot_s
    decode_ok = np.nan_to_num(per_token, nan=0.0) <= bound
    out = []
    for start in np.arange(0.0, end_s, window_s):
        mask = (result.arrival_s >= start) & (result.arrival_s < start + window_s)
        out.append(
            WindowStats(
                float(start),
                float(ttft_ok[mask].mean()) if mask.any() else float("nan"),
                float(decode_ok[mask].mean()) if mask.any() else float("nan"),
            )
        )
    return out


def _hour_stats(result: SimResult, slo: SLO, day: list[Hour], seconds_per_hour: float):
    """Per hour: attainment of the requests arriving in it, prefill serving at its end, and
    the mean instances held over it."""
    hour_of = (result.arrival_s // seconds_per_hour).astype(int)
    roles = result.roles
    out = []
    for i in range(len(day)):
        start, end = i * seconds_per_hour, (i + 1) * seconds_per_hour
        prefill = [r.num_prefill for r in roles if r.time_s <= end][-1]
        held = held_seconds(roles, start, end) / seconds_per_hour
        out.append((_attainment(result, slo, hour_of == i), prefill, held))
    return out


def _simulate(mode: str, sim: Simulator, specs, controller: ControllerConfig, scaling: SimScaling) -> SimResult:
    if mode == "fixed":
        return sim.run(specs)
    if mode == "switch":
        return sim.run(specs, RatioController(controller))
    return sim.run(specs, RatioController(controller), msgspec.structs.replace(scaling, mode=mode))


def _day_mode(
    mode: str, result: SimResult, slo: SLO, seconds_per_hour: float, window_s: float, end_s: float, gpus: int
):
    events = [
        (d.time_s, "switch", "prefill" if d.move is Move.TO_PREFILL else "decode", d.reason) for d in result.moves
    ]
    events += [(e.time_s, e.action.value, e.role, e.reason) for e in result.scale_events if e.action.value != "switch"]
    instance_hours = held_seconds(result.roles, 0.0, end_s) / seconds_per_hour  # over the day's hours
    return DayMode(
        name=mode,
        attainment=float(good_requests(result, slo).mean()),
        instance_hours=instance_hours,
        gpu_hours=instance_hours * gpus,
        num_moves=len(result.moves),
        num_added=sum(e.action.value == "add" for e in result.scale_events),
        num_removed=sum(e.action.value == "remove" for e in result.scale_events),
        windows=_windows(result, slo, window_s, end_s),
        roles=[tuple(r[:6]) for r in result.roles],
        events=sorted(events),
    )


def run_day(
    profile: LatencyProfile,
    *,
    num_instances: int,
    seconds_per_hour: float,
    slo: SLO,
    link: KVLink,
    controller: ControllerConfig,
    plan_instances: int = 8,
    fixed_prefill: int | None = None,
    control_interval_s: float = 1.0,
    seed: int = 0,
    hours: tuple = HOURS,
    modes: tuple[str, ...] = DEFAULT_MODES,
    scale: ScalingConfig | None = None,
    startup_delay_s: float = 1.0,
    idle_threshold: float = 0.5,
) -> DayResult:
    """`modes` (DAY_MODES): "fixed" holds the ratio, "switch" lets the ratio controller move
    instances between roles, "scale" lets it add instances (up to `num_instances` held) and
    remove idle ones instead, "both" adds when there is room and switches when not; the
    scaling modes take their bounds, cool-down and idle window from `scale` (default: pools
    of 1 to `num_instances`, the live defaults otherwise)."""
    unknown = [m for m in modes if m not in DAY_MODES]
    if unknown or not modes:
        raise ValueError(f"modes: expected some of {DAY_MODES}, got {list(modes)}")
    if scale is None:
        n = num_instances
        scale = ScalingConfig(bounds=PoolBounds(min_prefill=1, max_prefill=n, min_decode=1, max_decode=n))
    scaling = SimScaling(
        policy=scale, capacity=num_instances, startup_delay_s=startup_delay_s, idle_threshold=idle_threshold
    )
    shapes = list({shape.name: shape for _, shape in hours}.values())
    plans = plan_shapes(profile, slo, link, plan_instances, shapes)
    by_name = {p.shape: p for p in plans}
    day: list[Hour] = day_hours(
        {p.shape: p.goodput_per_instance for p in plans}, num_instances, seconds_per_hour, hours
    )
    specs = make_day(day, seconds_per_hour, seed)
    if fixed_prefill is None:
        weight = sum(h.rate_rps for h in day)
        fraction = sum(h.rate_rps * by_name[h.shape.name].prefill_fraction for h in day) / weight
        fixed_prefill = min(num_instances - 1, max(1, round(fraction * num_instances)))
    cluster = ClusterSpec.split(fixed_prefill, num_instances - fixed_prefill)
    sim = Simulator(profile, cluster, SimOptions(link=link, control_interval_s=control_interval_s))
    end_s = len(day) * seconds_per_hour
    results, per_mode = {}, []
    for mode in dict.fromkeys(modes):
        results[mode] = _simulate(mode, sim, specs, controller, scaling)
        per_mode.append(
            _day_mode(mode, results[mode], slo, seconds_per_hour, controller.window_s, end_s, profile.tensor_parallel)
        )
    by_hour = {mode: _hour_stats(result, slo, day, seconds_per_hour) for mode, result in results.items()}
    hour_stats = [
        HourStats(
            i,
            h.shape.name,
            h.rate_rps,
            attainment={mode: by_hour[mode][i][0] for mode in results},
            prefill={mode: by_hour[mode][i][1] for mode in results},
            held={mode: by_hour[mode][i][2] for mode in results},
        )
        for i, h in enumerate(day)
    ]
    return DayResult(
        profile=profile.name,
        num_instances=num_instances,
        gpus_per_instance=profile.tensor_parallel,
        seconds_per_hour=seconds_per_hour,
        slo=slo.describe(),
        shapes=plans,
        fixed_prefill=fixed_prefill,
        num_requests=len(specs),
        hours=hour_stats,
        window_s=controller.window_s,
        startup_delay_s=startup_delay_s,
        modes=per_mode,
    )
