"""A day on a large cluster: a fixed P:D ratio against the ratio controller.

1. For each of the day's shapes alone, plan the best split on a small cluster
   (`plan_instances`): its prefill fraction and goodput per instance.
2. Build the day (`day_workload`): each hour's rate is its load x that goodput x N.
3. The fixed ratio is the one a planner would provision for the whole day: the prefill
   fraction of each hour's best split, weighted by the hour's request count, times N.
4. Simulate the day with that ratio fixed, and again starting from it with a
   `RatioController` moving instances; compare attainment per hour and per window.
"""

from __future__ import annotations

import msgspec
import numpy as np

from minipd.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.planner.experiments.day_workload import HOURS, Hour, Shape, day_hours, make_day, shape_workload
from minipd.planner.kv_link import KVLink
from minipd.planner.latency_profile import LatencyProfile
from minipd.planner.planner import PlanConfig, plan
from minipd.planner.sim_result import SimResult
from minipd.planner.sim_summary import good_requests
from minipd.planner.simulator import Simulator
from minipd.policy.ratio_controller import ControllerConfig, RatioController
from minipd.slo.targets import SLO

PLAN_REQUESTS_PER_INSTANCE = 150


class ShapePlan(msgspec.Struct, frozen=True):
    shape: str
    best_split: str
    prefill_fraction: float
    goodput_per_instance: float


class HourStats(msgspec.Struct, frozen=True):
    hour: int
    shape: str
    rate_rps: float
    fixed_attainment: float
    controller_attainment: float
    controller_prefill: int  # prefill instances at the end of the hour


class WindowStats(msgspec.Struct, frozen=True):
    start_s: float
    ttft_attainment: float
    decode_attainment: float


class DayResult(msgspec.Struct, frozen=True):
    profile: str
    num_instances: int
    seconds_per_hour: float
    slo: str
    shapes: list[ShapePlan]
    fixed_prefill: int
    num_requests: int
    fixed_attainment: float
    controller_attainment: float
    hours: list[HourStats]
    window_s: float
    fixed_windows: list[WindowStats]
    controller_windows: list[WindowStats]
    controller_roles: list[tuple[float, int, int, int]]  # (time, prefill, decode, switching)
    moves: list[tuple[float, str, str]]  # (time, move, reason)


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
) -> DayResult:
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
    options = SimOptions(link=link, control_interval_s=control_interval_s)
    fixed = Simulator(profile, cluster, options).run(specs)
    ctl = RatioController(controller)
    controlled = Simulator(profile, cluster, options).run(specs, ctl)
    hour_of = (fixed.arrival_s // seconds_per_hour).astype(int)
    roles = [(r.time_s, r.num_prefill, r.num_decode, r.num_switching) for r in controlled.roles]
    hour_stats = []
    for i, h in enumerate(day):
        mask = hour_of == i
        end = (i + 1) * seconds_per_hour
        prefill_then = [p for t, p, _, _ in roles if t <= end][-1]
        hour_stats.append(
            HourStats(
                i,
                h.shape.name,
                h.rate_rps,
                _attainment(fixed, slo, mask),
                _attainment(controlled, slo, mask),
                prefill_then,
            )
        )
    window = controller.window_s
    end_s = len(day) * seconds_per_hour
    return DayResult(
        profile=profile.name,
        num_instances=num_instances,
        seconds_per_hour=seconds_per_hour,
        slo=slo.describe(),
        shapes=plans,
        fixed_prefill=fixed_prefill,
        num_requests=len(specs),
        fixed_attainment=float(good_requests(fixed, slo).mean()),
        controller_attainment=float(good_requests(controlled, slo).mean()),
        hours=hour_stats,
        window_s=window,
        fixed_windows=_windows(fixed, slo, window, end_s),
        controller_windows=_windows(controlled, slo, window, end_s),
        controller_roles=roles,
        moves=[(d.time_s, d.move.value, d.reason) for d in controlled.moves],
    )
