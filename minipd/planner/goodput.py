"""Goodput in DistServe's sense: the highest arrival rate at which SLO attainment stays at or
above the target (90%), found by bracketing then bisecting over the rate.

Attainment falls as the rate rises, but a finite simulated run is noisy near the edge, so
the search returns the highest rate it *saw* meeting the target, to within `rel_tol`.
Every evaluation at rate r uses the same seed, so runs at different rates share their
random draws (common random numbers) and attainment is close to monotone in r.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

MAX_BRACKET_STEPS = 40  # doublings or halvings: a factor of 2^40 either way


class GoodputResult(msgspec.Struct, frozen=True):
    rate_rps: float  # 0 when even the lowest rate tried misses the target
    attainment: float  # at rate_rps
    evaluations: list[tuple[float, float]]  # (rate, attainment) in the order tried


def find_goodput(
    attainment_at: Callable[[float], float],
    start_rps: float,
    target: float = 0.9,
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
