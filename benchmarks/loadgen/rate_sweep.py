"""A request-rate sweep of running deployments, and each one's goodput per SLO.

Each rate is one run of the workload per deployment (its own seed and prompts), ascending.
Once every SLO's attainment of a deployment has fallen below `stop_below`, it runs no higher
rates (they would only queue longer); its lists then hold the measured rates only. With
`bisect_steps`, each SLO's goodput is refined by bisection between the two rates around its
crossing, on the same deployment.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

from benchmarks.loadgen.measure import Measured
from minipd.slo.goodput import ATTAINMENT_TARGET, bisect_goodput, goodput_from_sweep
from minipd.slo.targets import SLO

DEFAULT_STOP_BELOW = 0.3


class RatePoint(NamedTuple):
    rate: float
    measured: Measured


class SweepResult(NamedTuple):
    points: list[RatePoint]  # ascending rates, bisection probes included
    goodput: dict[str, float]  # per SLO name, requests per second
    goodput_bracket: dict[str, tuple[float, float]]
    goodput_flags: dict[str, str]  # "below range" / "above range" where the sweep did not bracket it

    def as_json(self, slos: dict[str, SLO]) -> dict:
        """`rates`, `attainment` and `good_rps` (per SLO), `p90_ttft_ms`, `p90_itl_ms`, `goodput_rps`
        (per SLO), and how each run went."""
        points = self.points
        return {
            "rates": [p.rate for p in points],
            "attainment": {name: [p.measured.attainment(slo) for p in points] for name, slo in slos.items()},
            "good_rps": {name: [p.measured.good_per_s(slo) for p in points] for name, slo in slos.items()},
            "p90_ttft_ms": [p.measured.p90_ttft_ms() for p in points],
            "p90_itl_ms": [p.measured.p90_itl_ms() for p in points],
            "p99_itl_ms": [p.measured.itl_percentile_ms(99) for p in points],
            "num_requests": [len(p.measured.records) for p in points],
            "num_failed": [p.measured.summary.failed for p in points],
            "duration_s": [p.measured.summary.duration_s for p in points],
            "foreign_cpu": [p.measured.foreign_cpu for p in points],
            "reruns": [p.measured.reruns for p in points],
            "goodput_rps": dict(self.goodput),
            "goodput_bracket": {name: list(b) for name, b in self.goodput_bracket.items()},
            "goodput_flags": dict(self.goodput_flags),
        }


def sweep_rates(
    rates: list[float],
    runners: dict[str, Callable[[float, int], Measured]],
    slos: dict[str, SLO],
    stop_below: float = DEFAULT_STOP_BELOW,
    bisect_steps: int = 0,
    target: float = ATTAINMENT_TARGET,
) -> dict[str, SweepResult]:
    """Sweep every deployment of `runners` (name -> `run_at(rate, run_number)`, run numbers
    unique per deployment) over the same rates, interleaved: at each rate every deployment
    runs once, in an order that alternates from rate to rate, so that the drift of a shared
    machine hits all of them alike."""
    points: dict[str, list[RatePoint]] = {name: [] for name in runners}
    active = list(runners)
    for step, rate in enumerate(sorted(rates)):
        for name in active if step % 2 == 0 else active[::-1]:
            measured = runners[name](rate, len(points[name]))
            points[name].append(RatePoint(rate, measured))
        active = [
            name
            for name in active
            if any(points[name][-1].measured.attainment(slo) >= stop_below for slo in slos.values())
        ]
        if not active:
            break
    return {name: _goodputs(points[name], runners[name], slos, bisect_steps, target) for name in runners}


def _goodputs(
    points: list[RatePoint],
    run_at: Callable[[float, int], Measured],
    slos: dict[str, SLO],
    bisect_steps: int,
    target: float,
) -> SweepResult:
    goodput, brackets, flags = {}, {}, {}
    for name, slo in slos.items():
        measured_points = sorted(points, key=lambda p: p.rate)
        found = goodput_from_sweep(
            [p.rate for p in measured_points], [p.measured.attainment(slo) for p in measured_points], target
        )
        if bisect_steps and not (found.below_range or found.above_range):
            cache = {p.rate: p.measured for p in points}

            def attainment_at(rate: float, slo: SLO = slo, cache: dict = cache) -> float:
                if rate not in cache:
                    cache[rate] = run_at(rate, len(points))
                    points.append(RatePoint(rate, cache[rate]))
                return cache[rate].attainment(slo)

            found = bisect_goodput(attainment_at, *found.bracket, steps=bisect_steps, target=target).goodput
        goodput[name], brackets[name] = found.rps, found.bracket
        if found.below_range or found.above_range:
            flags[name] = "below range" if found.below_range else "above range"
    points.sort(key=lambda p: p.rate)
    return SweepResult(points, goodput, brackets, flags)


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; infinite when only the denominator is 0, NaN when both are."""
    if denominator > 0:
        return numerator / denominator
    return math.inf if numerator > 0 else math.nan
