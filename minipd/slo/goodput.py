"""Goodput in DistServe's sense: the highest request rate at which SLO attainment stays at or
above the target (90%).

Three ways to find it:
- `find_goodput`, for a simulator: bracket by doubling or halving from a start rate, then
  bisect geometrically to within `rel_tol`. A finite simulated run is noisy near the edge,
  so it returns the highest rate it *saw* meeting the target; every evaluation at rate r
  uses the same seed, so runs at different rates share their random draws (common random
  numbers) and attainment is close to monotone in r;
- `goodput_from_sweep`, for measured rate sweeps: the first place, going up in rate, where
  attainment falls below the target, interpolated linearly between the two rates around it;
- `bisect_goodput`, for measurements: halve a [passing, failing] bracket a number of times.
Measured curves are noisy and need not be monotone; the last two take the first crossing
from below, so a lucky point beyond a failing one never raises the goodput.
`bandwidth_threshold` applies the sweep's rule to link bandwidth (transfer time 1/bandwidth).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec

ATTAINMENT_TARGET = 0.9
MAX_BRACKET_STEPS = 40  # doublings or halvings: a factor of 2^40 either way


class GoodputResult(msgspec.Struct, frozen=True):
    rate_rps: float  # 0 when even the lowest rate tried misses the target
    attainment: float  # at rate_rps
    evaluations: list[tuple[float, float]]  # (rate, attainment) in the order tried


def find_goodput(
    attainment_at: Callable[[float], float],
    start_rps: float,
    target: float = ATTAINMENT_TARGET,
    rel_tol: float = 0.02,
    min_rps: float = 1e-6,
) -> GoodputResult:
    if not (start_rps > 0 and math.isfinite(start_rps)):
        raise ValueError(f"goodput: start rate must be positive, got {start_rps}")
    if not rel_tol > 0:
        raise ValueError(f"goodput: rel_tol must be positive, got {rel_tol}")
    seen: list[tuple[float, float]] = []

    def meets(rate: float) -> bool:
        attainment = attainment_at(rate)
        seen.append((rate, attainment))
        return attainment >= target

    lo = hi = None
    rate = start_rps
    for _ in range(MAX_BRACKET_STEPS):
        if meets(rate):
            lo = rate
            if hi is not None:
                break
            rate *= 2
        else:
            hi = rate
            if lo is not None:
                break
            rate /= 2
            if rate < min_rps:
                break
    if lo is None:
        return GoodputResult(0.0, 0.0, seen)
    if hi is None:
        raise ValueError(f"goodput: attainment still meets the target at {lo:g} rps; the load never saturates")
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    best = max(r for r, a in seen if a >= target)
    return GoodputResult(best, next(a for r, a in seen if r == best), seen)


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
