"""Step-time jitter: the simulated instances run on a machine whose speed wanders.

A latency profile gives a step's mean duration for its shape. On a real host the same step
takes longer or shorter from moment to moment: other tenants of the host, memory-bandwidth
and frequency changes. On the machines this project is measured on, the same matmul loop
took 64 to 138 ms within one minute, and a serving instance's step times stray from the
fitted model by ±25% (P10–P90), in spells lasting seconds, not step by step. A deterministic
simulator then predicts medians well but tails (ITL P90, TTFT P90) and per-request TPOT
spreads too tight.

`StepJitter` multiplies every step's duration by `exp(x)`, where `x` is the sum of
- a slow part, an Ornstein–Uhlenbeck process of standard deviation `sigma_slow` and
  correlation time `tau_s`, evolving in simulated time (so a slow spell spans many steps);
- a per-step part, independent normal noise of standard deviation `sigma_step`;
less `(sigma_slow² + sigma_step²) / 2`, so that the mean factor is 1 and the profile's mean
step time is kept. Each instance (by index) has its own process, seeded from `seed` and the
index, so a run is reproducible and instances' slow spells are independent (each instance
runs on its own cores). `minipd.ops.planner.step_log_speed.fit_jitter` fits the parameters to
the steps that serving instances logged.
"""

from __future__ import annotations

import bisect
import math

import msgspec
import numpy as np


class StepJitter(msgspec.Struct, frozen=True, kw_only=True):
    sigma_slow: float = 0.0  # std of the slow part of log(step factor)
    tau_s: float = 1.0  # correlation time of the slow part, seconds
    sigma_step: float = 0.0  # std of the per-step part of log(step factor)
    seed: int = 0

    def __post_init__(self) -> None:
        for field in ("sigma_slow", "sigma_step"):
            value = getattr(self, field)
            if not (math.isfinite(value) and 0 <= value <= 2):
                raise ValueError(f"{field}: must be in [0, 2], got {value}")
        if not (math.isfinite(self.tau_s) and self.tau_s > 0):
            raise ValueError(f"tau_s: must be finite and positive, got {self.tau_s}")

    def replace(self, **changes) -> StepJitter:
        return msgspec.structs.replace(self, **changes)


class _InstanceSpeed:
    __slots__ = ("rng", "x", "t")

    def __init__(self, seed: int, index: int, sigma_slow: float):
        self.rng = np.random.default_rng([seed, index])
        self.x = self.rng.normal(0.0, sigma_slow) if sigma_slow else 0.0  # stationary from the start
        self.t = 0.0


class SpeedProcess:
    """The step factors of every instance of one simulated run."""

    def __init__(self, jitter: StepJitter):
        self.jitter = jitter
        self._bias = (jitter.sigma_slow**2 + jitter.sigma_step**2) / 2
        self._instances: dict[int, _InstanceSpeed] = {}

    def factor(self, index: int, now: float) -> float:
        """The factor of instance `index`'s step that starts at `now` (times must not go back
        per instance); the same instance keeps its process across role changes."""
        j = self.jitter
        state = self._instances.get(index)
        if state is None:
            state = self._instances[index] = _InstanceSpeed(j.seed, index, j.sigma_slow)
        if j.sigma_slow:
            keep = math.exp(-max(now - state.t, 0.0) / j.tau_s)  # exact OU step over the elapsed time
            state.x = state.x * keep + j.sigma_slow * math.sqrt(1.0 - keep * keep) * state.rng.normal()
        state.t = now
        step = state.rng.normal(0.0, j.sigma_step) if j.sigma_step else 0.0
        return math.exp(state.x + step - self._bias)


class SpeedTrace(msgspec.Struct, frozen=True):
    """A measured speed instead of a modelled one: per instance index, the factor its steps
    ran at over time (`times` in simulated seconds, ascending; a step starting at `t` takes
    the factor of the last time <= t, the first one before it), and the spread of single
    steps around it (`sigma_step`, the std of log step factor; each step draws its own, with
    mean 1). Built from the steps a real run logged (`step_log_speed.speed_trace`), it replays
    that machine's slow and fast spells, so the simulator is judged on what it models
    (queues, batches, KV, links), not on the host's other tenants. Instances it does not list
    run at factor 1."""

    times: dict[int, tuple[float, ...]]
    factors: dict[int, tuple[float, ...]]
    sigma_step: dict[int, float] = {}
    seed: int = 0

    def __post_init__(self) -> None:
        if set(self.times) != set(self.factors) or not set(self.sigma_step) <= set(self.times):
            raise ValueError("speed trace: times, factors and sigma_step must list the same instances")
        for index, times in self.times.items():
            factors = self.factors[index]
            if len(times) != len(factors) or not times:
                raise ValueError(f"speed trace: instance {index} needs as many factors as times, at least one")
            if any(b < a for a, b in zip(times, times[1:])):
                raise ValueError(f"speed trace: instance {index}'s times must ascend")
            if not all(math.isfinite(f) and f > 0 for f in factors):
                raise ValueError(f"speed trace: instance {index}'s factors must be finite and positive")
        for index, sigma in self.sigma_step.items():
            if not (math.isfinite(sigma) and 0 <= sigma <= 2):
                raise ValueError(f"speed trace: instance {index}'s sigma_step must be in [0, 2], got {sigma}")

    def level(self, index: int, now: float) -> float:
        """The traced factor at `now`, without the per-step spread."""
        times = self.times.get(index)
        if times is None:
            return 1.0
        return self.factors[index][max(bisect.bisect_right(times, now) - 1, 0)]


class TracedSpeed:
    """The step factors of one simulated run that replays `trace`."""

    def __init__(self, trace: SpeedTrace):
        self.trace = trace
        self._rngs: dict[int, np.random.Generator] = {}

    def factor(self, index: int, now: float) -> float:
        level = self.trace.level(index, now)
        sigma = self.trace.sigma_step.get(index, 0.0)
        if not sigma:
            return level
        rng = self._rngs.get(index)
        if rng is None:
            rng = self._rngs[index] = np.random.default_rng([self.trace.seed, index])
        return level * math.exp(rng.normal(0.0, sigma) - sigma * sigma / 2)
