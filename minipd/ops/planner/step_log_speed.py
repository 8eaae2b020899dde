"""How fast the machine ran, from logged steps against a profile's step models.

A step's ratio is its logged duration over the profile's prediction for its shape (pure
prefill steps against the prefill model, pure decode steps against the decode model, as
`step_log_fit` fits them). Over one stretch of time:
- `speed_factor`: the geometric mean ratio, the one number by which that stretch ran slower
  (> 1) or faster than the profile;
- `speed_trace`: the `SpeedTrace` of each instance, a running mean of its ratios and the
  spread of single steps around it, to replay that stretch's machine in the simulator;
- `fit_jitter`: the `StepJitter` whose factors vary as the ratios did around each stretch's
  own mean: their variance, split by the lag-1 autocorrelation into a slow part and a
  per-step part, and the slow part's correlation time from the integrated autocorrelation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.step_jitter import SpeedTrace, StepJitter
from minipd.ops.planner.step_log_fit import Step

MIN_STEPS = 8  # fewer ratios than this say nothing about a spread
RHO_FLOOR = 0.05  # the autocorrelation sum stops where the correlation has died out
TRACE_WINDOW_S = 1.0  # a speed trace's point is the mean ratio of the steps this close
TRACE_GRID_S = 0.1


def is_prefill(step: Step) -> bool:
    return bool(step.q) and not step.ctx


def is_decode(step: Step) -> bool:
    return bool(step.ctx) and not step.q


def pure_steps(steps: Sequence[Step], role: str) -> list[Step]:
    """The steps of `steps` that ran only `role` ("prefill" or "decode") work."""
    if role not in ("prefill", "decode"):
        raise ValueError(f"role: expected 'prefill' or 'decode', got {role!r}")
    return [s for s in steps if (is_prefill(s) if role == "prefill" else is_decode(s))]


def ratios(profile: LatencyProfile, steps: Sequence[Step], role: str) -> np.ndarray:
    """Logged over predicted duration of each pure `role` step, in order."""
    pure = pure_steps(steps, role)
    if role == "prefill":
        predicted = [profile.prefill.step_s(sum(s.q), float(sum(q * k for q, k in zip(s.q, s.k)))) for s in pure]
    else:
        predicted = [profile.decode.step_s(sum(s.ctx), len(s.ctx)) for s in pure]
    actual = np.array([s.seconds for s in pure], dtype=float)
    return actual / np.maximum(np.array(predicted, dtype=float), 1e-9)


def speed_factor(profile: LatencyProfile, steps: Sequence[Step], role: str) -> float:
    """The geometric mean ratio of the `role` steps (1.0 when there are none)."""
    r = ratios(profile, steps, role)
    return float(math.exp(np.log(r).mean())) if len(r) else 1.0


def speed_trace(
    profile: LatencyProfile,
    instances: dict[int, tuple[Sequence[Step], str]],
    origin_s: float,
    window_s: float = TRACE_WINDOW_S,
    grid_s: float = TRACE_GRID_S,
    seed: int = 0,
) -> SpeedTrace:
    """Per simulated instance index, its (steps, role): the factor every `grid_s` from the
    first step to the last (times from `origin_s`, the clock reading of simulated time 0) is
    the mean ratio of the role's steps that started within `window_s / 2` of that time (the
    mean, so a window's steps keep their total time), or the nearest point's where none did;
    `sigma_step` is the spread of single steps' log ratios around it. An instance with no
    such step is left out (factor 1)."""
    times, factors, spread = {}, {}, {}
    for index, (steps, role) in instances.items():
        pure = pure_steps(steps, role)
        if not pure:
            continue
        t = np.array([step.start_s - origin_s for step in pure])
        order = np.argsort(t, kind="stable")
        t, r = t[order], ratios(profile, steps, role)[order]
        grid = np.arange(t[0], t[-1] + grid_s, grid_s)
        lo = np.searchsorted(t, grid - window_s / 2, side="left")
        hi = np.searchsorted(t, grid + window_s / 2, side="right")
        values = np.array([r[a:b].mean() if b > a else np.nan for a, b in zip(lo, hi)])
        known = ~np.isnan(values)
        values = np.interp(grid, grid[known], values[known])
        at_step = values[np.clip(np.searchsorted(grid, t, side="right") - 1, 0, len(grid) - 1)]
        times[index] = tuple(float(x) for x in grid)
        factors[index] = tuple(float(x) for x in values)
        spread[index] = min(float(np.std(np.log(r / at_step))), 2.0) if len(r) >= MIN_STEPS else 0.0
    return SpeedTrace(times, factors, spread, seed)


def fit_jitter(profile: LatencyProfile, stretches: Sequence[Sequence[Step]], role: str, seed: int = 0) -> StepJitter:
    """The jitter of `role` steps around each stretch's own mean speed (so a stretch that ran
    slower throughout adds nothing here: `speed_factor` says that). No jitter from stretches
    with fewer than `MIN_STEPS` steps between them."""
    logs, spacings = [], []
    for stretch in stretches:
        r = ratios(profile, stretch, role)
        if len(r) < MIN_STEPS:
            continue
        x = np.log(r) - np.log(r).mean()
        logs.append(x)
        starts = np.array([s.start_s for s in pure_steps(stretch, role)])
        spacings.append(float(np.median(np.diff(starts))))
    if not logs:
        return StepJitter(seed=seed)
    variance = float(np.mean(np.concatenate(logs) ** 2))
    if variance <= 0:
        return StepJitter(seed=seed)
    rhos = [_autocorrelation(x) for x in logs]
    weights = [len(x) for x in logs]
    lag1 = float(np.clip(np.average([rho[0] if len(rho) else 0.0 for rho in rhos], weights=weights), 0.0, 0.999))
    sigma_slow, sigma_step = math.sqrt(lag1 * variance), math.sqrt((1 - lag1) * variance)
    tau = _correlation_time(rhos, spacings, weights, lag1)
    return StepJitter(sigma_slow=min(sigma_slow, 2.0), tau_s=tau, sigma_step=min(sigma_step, 2.0), seed=seed)


def _autocorrelation(x: np.ndarray) -> np.ndarray:
    """rho_k for k = 1 .. len/4 of a zero-mean series."""
    n, var = len(x), float(np.mean(x * x))
    if var <= 0:
        return np.zeros(0)
    return np.array([float(np.mean(x[:-k] * x[k:])) / var for k in range(1, max(n // 4, 1) + 1)])


def _correlation_time(rhos: list[np.ndarray], spacings: list[float], weights: list[int], lag1: float) -> float:
    """The slow part's correlation time in seconds: the median time between steps times the
    sum of rho_k / rho_1 until the correlation dies out (for an OU process sampled every dt
    this sum is about tau / dt), averaged over stretches by their length."""
    if lag1 <= RHO_FLOOR:
        return max(float(np.mean(spacings)), 1e-3)
    taus = []
    for rho, dt in zip(rhos, spacings):
        total = 0.0
        for value in rho:
            if value <= RHO_FLOOR:
                break
            total += value / lag1
        taus.append(max(total, 1.0) * dt)
    return float(np.average(taus, weights=weights))
