"""How a simulated P/D cluster may grow and shrink during a run (`Simulator.run(scaling=...)`).

The decisions are the live scaler's: `minipd.policy.pool_scaling.PoolScaler`, fed the role
the ratio controller wants (`pool_scaling.wanted`) every control tick, growing that pool
when it wants one and otherwise shrinking a pool idle past its window. What the simulator
adds:
- `mode`: "switch" (never add: the cluster has no room), "scale" (never switch) or "both";
- `capacity`: the instances the cluster can hold at once (starting and draining ones
  included), so there is room for an add while fewer are held;
- a pool's business, per tick: busy unless its load spread over one instance fewer stays
  under `idle_threshold` (`pool_busy`; prefill's load is the fraction of the tick its
  instances spent stepping, decode's the KV reserved over capacity). The live scaler calls a
  pool idle only when no request is on it, which a cluster serving all day never is;
- an added instance holds its slot from the decision and serves `startup_delay_s` later
  (the model load); a removed one takes no new work, finishes what it holds and then frees
  its slot.
"""

from __future__ import annotations

import math

import msgspec

from minipd.policy.pool_scaling import ScalingConfig

SIM_SCALE_MODES = ("switch", "scale", "both")


class SimScaling(msgspec.Struct, frozen=True, kw_only=True):
    policy: ScalingConfig
    capacity: int
    mode: str = "both"
    startup_delay_s: float = 0.0
    idle_threshold: float = 0.5

    def __post_init__(self) -> None:
        if self.mode not in SIM_SCALE_MODES:
            raise ValueError(f"mode: expected one of {SIM_SCALE_MODES}, got {self.mode!r}")
        if self.capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {self.capacity}")
        if not (math.isfinite(self.startup_delay_s) and self.startup_delay_s >= 0):
            raise ValueError(f"startup_delay_s: must be finite and >= 0, got {self.startup_delay_s}")
        if not 0 < self.idle_threshold <= 1:
            raise ValueError(f"idle_threshold: must be in (0, 1], got {self.idle_threshold}")

    @property
    def adds(self) -> bool:
        return self.mode in ("scale", "both")

    @property
    def switches(self) -> bool:
        return self.mode in ("switch", "both")


def pool_busy(load: float, size: int, threshold: float) -> bool:
    """Whether a pool of `size` instances under `load` (0..1 of what it can do) needs all of
    them: one instance fewer would run it at `threshold` or more (a lone instance always does)."""
    return size <= 1 or load * size / (size - 1) >= threshold
