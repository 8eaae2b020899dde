"""The pool scaling policy: add an instance of a role, remove one, switch one, or hold.

Pure (no I/O, no clock of its own, no Ray): the live scaler on the router
(minipd/ops/control_loop/pool_scaler.py) feeds it what it measured and acts on its answers; a launcher
that can start instances (`--launcher ray`) carries them out. It works beside the ratio
controller (ratio_controller.py), which says which role needs another instance; this policy
says whether to add one or to switch one, and when to give an idle pool's instance back:

1. `wanted(decision)`: the role the ratio controller's decision asks for, if any: a move to
   prefill or to decode, or a hold because the pool it would take the instance from is at
   its minimum (the move it cannot make is still a want);
2. `grow(now, role, switch_allowed, sizes, room)`: hold while the role's pool is at its
   maximum (a switch would overfill it too) or within `cooldown_s` of the last scale event;
   else add an instance when the cluster has room for one of the role (`room`), else switch
   one from the other role when the ratio controller may (`switch_allowed`), else hold;
3. `observe(now, busy)` at every decision: a pool with no request on any of its instances is
   idle from that moment until it has one again;
4. `shrink(now, sizes)`: remove one instance of a pool idle for `idle_window_s` and above its
   minimum (decode first), outside the cool-down; the pool then counts as idle afresh, so the
   next removal waits a whole window more.
An add or a remove returned is a scale event: the cool-down starts there, and again once it is
`done`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import NamedTuple

import msgspec

from minipd.policy.ratio_controller import CAUSE_DECODE_AT_MIN, CAUSE_TTFT_AT_MIN, Decision, Move

PREFILL, DECODE = "prefill", "decode"  # the scaled roles (colocated instances are never scaled)
SCALED_ROLES = (PREFILL, DECODE)


class ScaleAction(enum.Enum):
    HOLD = "hold"
    ADD = "add"
    REMOVE = "remove"
    SWITCH = "switch"  # the ratio controller's own move, into `role`


class ScaleDecision(NamedTuple):
    time_s: float
    action: ScaleAction
    role: str | None  # the pool added to, removed from, or switched into
    reason: str


class PoolBounds(msgspec.Struct, frozen=True, kw_only=True):
    """How small and how large each scaled pool may be (colocated instances are never scaled)."""

    min_prefill: int = 1
    max_prefill: int = 1
    min_decode: int = 1
    max_decode: int = 1

    def __post_init__(self) -> None:
        for role in ("prefill", "decode"):
            low, high = getattr(self, f"min_{role}"), getattr(self, f"max_{role}")
            if low < 0:
                raise ValueError(f"min_{role}: must be >= 0, got {low}")
            if high < low:
                raise ValueError(f"max_{role}: must be >= min_{role} ({low}), got {high}")

    def min(self, role: str) -> int:
        return self.min_prefill if role == PREFILL else self.min_decode

    def max(self, role: str) -> int:
        return self.max_prefill if role == PREFILL else self.max_decode

    @property
    def scales(self) -> bool:
        """Some pool may change size."""
        return self.min_prefill < self.max_prefill or self.min_decode < self.max_decode


class ScalingConfig(msgspec.Struct, frozen=True, kw_only=True):
    bounds: PoolBounds = PoolBounds()
    idle_window_s: float = 60.0  # a pool idle this long gives an instance back
    cooldown_s: float = 30.0  # at least this long between two scale events

    def __post_init__(self) -> None:
        if not self.idle_window_s > 0:
            raise ValueError(f"scale_idle_window_s: must be positive, got {self.idle_window_s}")
        if not self.cooldown_s >= 0:
            raise ValueError(f"scale_cooldown_s: must be >= 0, got {self.cooldown_s}")


def wanted(decision: Decision) -> tuple[str | None, bool]:
    """(the role the ratio controller wants another instance of, whether it may switch one
    into it); (None, False) when it wants none."""
    if decision.move is Move.TO_PREFILL:
        return PREFILL, True
    if decision.move is Move.TO_DECODE:
        return DECODE, True
    if decision.cause == CAUSE_TTFT_AT_MIN:
        return PREFILL, False
    if decision.cause == CAUSE_DECODE_AT_MIN:
        return DECODE, False
    return None, False


class PoolScaler:
    def __init__(self, config: ScalingConfig):
        self.config = config
        self._last_event_s: float | None = None
        self._idle_since: dict[str, float | None] = dict.fromkeys(SCALED_ROLES)

    def _cooling(self, now: float) -> bool:
        return self._last_event_s is not None and now - self._last_event_s < self.config.cooldown_s

    def _event(self, now: float, action: ScaleAction, role: str, reason: str) -> ScaleDecision:
        self._last_event_s = now
        return ScaleDecision(now, action, role, reason)

    def done(self, now: float, role: str) -> None:
        """A scale event of `role`'s pool finished (an added instance serves, a removed one is
        gone): the cool-down starts again from here, and an idle pool counts as idle from here
        (an instance that took long to start gets a whole window)."""
        self._last_event_s = now
        if self._idle_since[role] is not None:
            self._idle_since[role] = now

    def observe(self, now: float, busy: Mapping[str, bool]) -> None:
        """Whether each pool has a request on any of its instances now."""
        for role in SCALED_ROLES:
            if busy.get(role, False):
                self._idle_since[role] = None
            elif self._idle_since[role] is None:
                self._idle_since[role] = now

    def idle_s(self, now: float, role: str) -> float:
        """How long `role`'s pool has been idle (0 when busy)."""
        since = self._idle_since[role]
        return 0.0 if since is None else now - since

    def grow(self, now: float, role: str, switch_allowed: bool, sizes: Mapping[str, int], room: bool) -> ScaleDecision:
        """`role` wants another instance: add one (`room`: the cluster can place one), switch
        one into it (`switch_allowed`), or hold. `sizes`: the instances of each pool now."""
        size, high = sizes[role], self.config.bounds.max(role)
        if size >= high:
            return ScaleDecision(now, ScaleAction.HOLD, role, f"{role} pool at its maximum ({high})")
        if self._cooling(now):
            return ScaleDecision(now, ScaleAction.HOLD, role, "cooling down after the last scale event")
        if room:
            return self._event(now, ScaleAction.ADD, role, f"{role} wanted, room for one more ({size + 1})")
        if switch_allowed:
            return ScaleDecision(now, ScaleAction.SWITCH, role, f"{role} wanted, no room for another instance")
        return ScaleDecision(
            now, ScaleAction.HOLD, role, f"{role} wanted, no room, and the other pool is at its minimum"
        )

    def shrink(self, now: float, sizes: Mapping[str, int]) -> ScaleDecision:
        """Remove an instance of a pool idle past the window and above its minimum, or hold."""
        if self._cooling(now):
            return ScaleDecision(now, ScaleAction.HOLD, None, "cooling down after the last scale event")
        for role in (DECODE, PREFILL):
            idle = self.idle_s(now, role)
            if idle >= self.config.idle_window_s and sizes[role] > self.config.bounds.min(role):
                self._idle_since[role] = now  # the next removal waits a whole window more
                return self._event(now, ScaleAction.REMOVE, role, f"{role} pool idle for {idle:.1f} s")
        return ScaleDecision(now, ScaleAction.HOLD, None, "no pool idle past the window above its minimum")
