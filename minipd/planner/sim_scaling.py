"""How a simulated P/D cluster may grow and shrink during a run (`Simulator.run(scaling=...)`).

Every control tick the simulator measures each pool's load (prefill: the fraction of the
tick its serving instances spent stepping; decode: reserved KV over capacity) into an
`IdleClock`, derives the role the ratio controller wants (`scale_policy.wanted_role`) and
asks `scale_policy.decide_scale`. An added instance holds its slot at once and serves
`startup_delay_s` later (loading the model); a removed one takes no new work, finishes what
it holds and then frees its slot.
"""

from __future__ import annotations

import math

import msgspec

from minipd.policy.scale_policy import ScaleConfig


class SimScaling(msgspec.Struct, frozen=True, kw_only=True):
    policy: ScaleConfig
    capacity: int  # instances the cluster can hold at once, starting and draining ones included
    startup_delay_s: float = 0.0  # from the add decision to serving
    idle_threshold: float = 0.5  # IdleClock: a pool is idle when one instance fewer stays under this load

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {self.capacity}")
        if not (math.isfinite(self.startup_delay_s) and self.startup_delay_s >= 0):
            raise ValueError(f"startup_delay_s: must be finite and >= 0, got {self.startup_delay_s}")
        if not 0 < self.idle_threshold <= 1:
            raise ValueError(f"idle_threshold: must be in (0, 1], got {self.idle_threshold}")
