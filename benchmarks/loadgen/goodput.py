"""Goodput in DistServe's sense: the highest request rate at which SLO attainment is at least
the target (90%).

Two ways to find it: from a rate sweep (`goodput_from_sweep`: the first place, going up in
rate, where attainment falls below the target, interpolated linearly between the two rates
around it), or by bisection on a measurement function (`bisect_goodput`). Measured curves
are noisy and need not be monotone; both take the first crossing from below, so a lucky
point beyond a failing one never raises the goodput.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

ATTAINMENT_TARGET = 0.9


class Goodput(NamedTuple):
    """`rps` is the goodput; `bracket` the measured rates around the crossing. When even the
    lowest rate fails, `rps` is 0 and `below_range`; when every rate passes, `rps` is the
    highest rate, a lower bound (`above_range`)."""

    rps: float
    bracket: tuple[float, float]
    below_range: bool = False
    above_range: bool = False


def goodput_from_sweep(
    rates: Sequence[float], attainments: Sequence[float], target: float = ATTAINMENT_TARGET
) -> Goodput:
    if len(rates) != len(attainments) or not rates:
        raise ValueError("goodput: need one attainment per rate, and at least one rate")
    points = sorted(zip(rates, attainments))
    if any(r <= 0 or not math.isfinite(r) for r, _ in points):
        raise ValueError(f"goodput: rates must be positive, got {sorted(rates)}")
    first_rate, first_attainment = points[0]
    if not first_attainment >= target:  # NaN (no requests) fails too
        return Goodput(0.0, (0.0, first_rate), below_range=True)
    for (low, a_low), (high, a_high) in zip(points, points[1:]):
        if not a_high >= target:
            a_high = 0.0 if math.isnan(a_high) else a_high
            return Goodput(low + (high - low) * (a_low - target) / (a_low - a_high), (low, high))
    last = points[-1][0]
    return Goodput(last, (last, last), above_range=True)


class Probe(NamedTuple):
    rate: float
    attainment: float


class BisectionResult(NamedTuple):
    goodput: Goodput
    probes: list[Probe]  # every measurement, in the order taken


def bisect_goodput(
    measure: Callable[[float], float], low: float, high: float, steps: int, target: float = ATTAINMENT_TARGET
) -> BisectionResult:
    """Measure `low` and `high`, then halve [passing, failing] `steps` times.

    If `low` already fails the result is 0 (`below_range`); if `high` passes, `high` (a lower
    bound, `above_range`). Otherwise the result is the highest passing rate probed, with
    the final bracket; its error is at most (high - low) / 2**steps.
    """
    if not 0 < low < high:
        raise ValueError(f"goodput bisection: need 0 < low < high, got {low}, {high}")
    probes = [Probe(low, measure(low))]
    if not probes[-1].attainment >= target:
        return BisectionResult(Goodput(0.0, (0.0, low), below_range=True), probes)
    probes.append(Probe(high, measure(high)))
    if probes[-1].attainment >= target:
        return BisectionResult(Goodput(high, (high, high), above_range=True), probes)
    passing, failing = low, high
    for _ in range(steps):
        middle = (passing + failing) / 2
        probes.append(Probe(middle, measure(middle)))
        if probes[-1].attainment >= target:
            passing = middle
        else:
            failing = middle
    return BisectionResult(Goodput(passing, (passing, failing)), probes)


class BandwidthThreshold(NamedTuple):
    """The link bandwidth below which attainment falls under the target. `gbps` is
    interpolated linearly in 1/bandwidth (transfer time) between `last_passing_gbps` and
    `first_failing_gbps`; None when the sweep never fails (`never_fails`) or fails even at its
    most generous bandwidth (`always_fails`)."""

    gbps: float | None
    last_passing_gbps: float | None
    first_failing_gbps: float | None
    never_fails: bool = False
    always_fails: bool = False


def bandwidth_threshold(
    link_gbps: Sequence[float], attainments: Sequence[float], target: float = ATTAINMENT_TARGET
) -> BandwidthThreshold:
    """Going from generous to starved, the first bandwidth at which attainment falls below
    `target` (as `goodput_from_sweep` does for rising rates, on the transfer time 1/bandwidth)."""
    found = goodput_from_sweep([1 / g for g in link_gbps], attainments, target)
    if found.below_range:
        return BandwidthThreshold(None, None, max(link_gbps), always_fails=True)
    if found.above_range:
        return BandwidthThreshold(None, min(link_gbps), None, never_fails=True)
    passing, failing = found.bracket
    return BandwidthThreshold(1 / found.rps, 1 / passing, 1 / failing)
