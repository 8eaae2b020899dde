"""The pool-scaling policy: add an instance, remove one, switch one between roles, or none.

Pure (no I/O, no clock of its own, no cluster import): the caller measures and counts, this
decides. The simulator calls it and the live controller is meant to call exactly this.

Per decision (`decide_scale(inputs, config, last_action_s, last_add_s)`, or
`ScalePolicy.decide`, which keeps those two times itself):
1. none within `cooldown_s` of the last action;
2. when the ratio controller wants more of a role (`inputs.wanted_role`, see `wanted_role`):
   add one of that role if the mode scales, the cluster has a free slot and the role's pool
   (serving plus starting) is under its maximum; otherwise switch one from the other role
   if the mode switches, the controller asked to move (`inputs.switch_wanted`), the other
   pool stays at or above its minimum and the wanted pool under its maximum;
3. otherwise, if the mode scales and nothing was added in the last `idle_window_s`, remove
   one instance from a pool that has been idle (`PoolState.idle_s`, see `IdleClock`) for
   at least `idle_window_s` and serves above its minimum, never from the wanted role (the
   longest-idle pool first): that can make the room a later add needs.
Growing is quick (an add needs only the controller's want and a free slot) and shrinking
slow (a whole idle window, and none while the cluster grows), as with other autoscalers:
a missing instance costs SLOs, a spare one only GPU time.
Modes: "switch" (only moves between roles: a fixed-size cluster), "scale" (only adds and
removes) and "both".
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

import msgspec

PREFILL, DECODE = "prefill", "decode"
ROLES = (PREFILL, DECODE)
SCALE_MODES = ("switch", "scale", "both")


class ScaleAction(enum.Enum):
    NONE = "none"
    ADD = "add"  # start one more instance of `role`
    REMOVE = "remove"  # drain one instance of `role`, then stop it
    SWITCH = "switch"  # drain one instance of the other role, then serve it as `role`


# A decision's `cause`: one of a fixed few (a metric label; `reason` says it in words).
CAUSE_COOLDOWN = "cooldown"
CAUSE_ADD = "wanted_with_room"
CAUSE_SWITCH = "wanted_no_room"
CAUSE_REMOVE = "idle"
CAUSE_AT_BOUNDS = "wanted_at_bounds"  # wanted, but neither an add nor a switch is allowed
CAUSE_STEADY = "steady"  # nothing wanted and no pool idle long enough above its minimum


class PoolState(NamedTuple):
    serving: int  # instances serving in this role now (draining ones excluded)
    starting: int = 0  # added, not serving yet
    idle_s: float = 0.0  # how long the pool has had room to lose an instance (IdleClock.idle_s)


class ScaleInput(NamedTuple):
    now_s: float
    prefill: PoolState
    decode: PoolState
    wanted_role: str | None  # the role the ratio controller wants more of, or None
    switch_wanted: bool  # the ratio controller decided to move an instance toward `wanted_role`
    free_instances: int  # instances the cluster has room to start now


class ScaleDecision(NamedTuple):
    time_s: float
    action: ScaleAction
    role: str | None  # ADD, REMOVE: the pool that grows or shrinks; SWITCH: the role it goes to
    reason: str
    cause: str


class ScaleConfig(msgspec.Struct, frozen=True, kw_only=True):
    mode: str = "both"  # one of SCALE_MODES
    min_prefill: int = 1
    max_prefill: int | None = None  # None: no bound but the cluster's room
    min_decode: int = 1
    max_decode: int | None = None
    cooldown_s: float = 5.0  # at least this long between two actions
    idle_window_s: float = 60.0  # a pool idle this long loses an instance

    def __post_init__(self) -> None:
        if self.mode not in SCALE_MODES:
            raise ValueError(f"scale mode: expected one of {SCALE_MODES}, got {self.mode!r}")
        if self.min_prefill < 0:
            raise ValueError(f"min_prefill: must be >= 0, got {self.min_prefill}")
        if self.min_decode < 1:
            raise ValueError(f"min_decode: must be >= 1 (decode instances admit every request), got {self.min_decode}")
        for role in ROLES:
            low, high = getattr(self, f"min_{role}"), getattr(self, f"max_{role}")
            if high is not None and high < low:
                raise ValueError(f"max_{role}: must be >= min_{role} ({low}), got {high}")
        for field in ("cooldown_s", "idle_window_s"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{field}: must be finite and >= 0, got {value}")

    @property
    def scales(self) -> bool:
        return self.mode in ("scale", "both")

    @property
    def switches(self) -> bool:
        return self.mode in ("switch", "both")

    def minimum(self, role: str) -> int:
        return self.min_prefill if role == PREFILL else self.min_decode

    def maximum(self, role: str) -> float:
        high = self.max_prefill if role == PREFILL else self.max_decode
        return math.inf if high is None else high


def _other(role: str) -> str:
    return DECODE if role == PREFILL else PREFILL


def decide_scale(
    inputs: ScaleInput, config: ScaleConfig, last_action_s: float | None = None, last_add_s: float | None = None
) -> ScaleDecision:
    """One decision (the module docstring has the rules); `last_action_s`: when the last
    action other than NONE was decided, for the cool-down; `last_add_s`: the last ADD."""
    now = inputs.now_s
    if inputs.wanted_role is not None and inputs.wanted_role not in ROLES:
        raise ValueError(f"wanted_role: expected one of {ROLES} or None, got {inputs.wanted_role!r}")
    if last_action_s is not None and now - last_action_s < config.cooldown_s:
        return ScaleDecision(now, ScaleAction.NONE, None, "cooling down", CAUSE_COOLDOWN)
    pools = {PREFILL: inputs.prefill, DECODE: inputs.decode}
    wanted = inputs.wanted_role
    blocked = ""
    if wanted is not None:
        pool, other = pools[wanted], pools[_other(wanted)]
        under_max = pool.serving + pool.starting < config.maximum(wanted)
        if config.scales and under_max and inputs.free_instances > 0:
            return ScaleDecision(now, ScaleAction.ADD, wanted, f"{wanted} wanted, room for one", CAUSE_ADD)
        if config.switches and inputs.switch_wanted and under_max and other.serving > config.minimum(_other(wanted)):
            return ScaleDecision(now, ScaleAction.SWITCH, wanted, f"{wanted} wanted, no room to add", CAUSE_SWITCH)
        parts = []
        if not under_max:
            parts.append(f"{wanted} at its maximum")
        else:
            if config.scales:
                parts.append("no room to add")
            if config.switches:
                parts.append(f"{_other(wanted)} at its minimum" if inputs.switch_wanted else "no move asked")
        blocked = f"{wanted} wanted: " + " and ".join(parts)
    if config.scales and (last_add_s is None or now - last_add_s >= config.idle_window_s):
        idle = [
            role
            for role in ROLES
            if role != wanted
            and pools[role].idle_s >= config.idle_window_s
            and pools[role].serving > config.minimum(role)
        ]
        if idle:
            role = max(idle, key=lambda r: pools[r].idle_s)
            return ScaleDecision(
                now, ScaleAction.REMOVE, role, f"{role} idle for {pools[role].idle_s:.1f} s", CAUSE_REMOVE
            )
    if blocked:
        return ScaleDecision(now, ScaleAction.NONE, wanted, blocked, CAUSE_AT_BOUNDS)
    return ScaleDecision(now, ScaleAction.NONE, None, "steady", CAUSE_STEADY)


class ScalePolicy:
    """`decide_scale` with the time of the last action remembered; `decisions` keeps every
    decision that acted."""

    def __init__(self, config: ScaleConfig):
        self.config = config
        self.last_action_s: float | None = None
        self.last_add_s: float | None = None
        self.decisions: list[ScaleDecision] = []

    def decide(self, inputs: ScaleInput) -> ScaleDecision:
        decision = decide_scale(inputs, self.config, self.last_action_s, self.last_add_s)
        if decision.action is not ScaleAction.NONE:
            self.last_action_s = inputs.now_s
            self.decisions.append(decision)
        if decision.action is ScaleAction.ADD:
            self.last_add_s = inputs.now_s
        return decision


def wanted_role(move_target: str | None, ttft_attainment: float, decode_attainment: float, floor: float) -> str | None:
    """The role the ratio controller wants more of, from its decision: the role it moved
    toward (`move_target`, None when it held), else the role whose attainment is below
    `floor` (the controller's target less its hysteresis), the lower one when both are: a
    ratio controller holds when both sides fail alike, and a pool that can grow should."""
    if move_target is not None:
        return move_target
    short = {
        role: value
        for role, value in ((PREFILL, ttft_attainment), (DECODE, decode_attainment))
        if not math.isnan(value) and value < floor
    }
    return min(short, key=short.__getitem__) if short else None


class IdleClock:
    """How long a pool has had room to lose one instance, from utilisation samples.

    The caller feeds `observe(now, utilization, size)` per pool, with `utilization` in
    [0, 1] however it measures load (the simulator: the fraction of time prefill instances
    were stepping; decode instances' reserved KV over their capacity). The pool is idle at
    a sample when the load, spread over one instance fewer, stays under `threshold`:
    `utilization * size / (size - 1) < threshold`. `idle_s(now)` is how long that has held
    at every sample since it last failed or since the pool last changed size (a pool of
    size <= 1 is never idle). Each sample is the caller's average over its own interval."""

    def __init__(self, threshold: float):
        if not 0 < threshold <= 1:
            raise ValueError(f"idle threshold: must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self._size: int | None = None
        self._since: float | None = None  # start of the current idle streak

    def observe(self, now: float, utilization: float, size: int) -> None:
        if size != self._size:
            self._size, self._since = size, None
        spread = utilization * size / (size - 1) if size > 1 else math.inf
        if spread < self.threshold:
            if self._since is None:
                self._since = now
        else:
            self._since = None

    def idle_s(self, now: float) -> float:
        return 0.0 if self._since is None else now - self._since
