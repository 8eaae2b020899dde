"""The live ratio controller turned on and off, and its SLO set, while the router serves.

`ControllerSwitch` owns the router's `LiveRatioController` (live_controller.py): `configure(
on=..., slo=..., target=...)` starts it, stops it, or restarts it with the new policy. A
restart begins a fresh sliding window (the old samples were judged against the old SLO); a
move under way when the controller stops or restarts finishes first. Started without
`--ratio-controller`, the router keeps the controller's flags (or their defaults) as the
policy to turn on with. `state()` is what the dashboard and `GET /admin/controller` show: on
or off, the policy, the last decision and every move so far (across restarts), and the
leadership: with an `election` (ops/registry/election.py, several routers) the controller
decides only while `election.leader`; without one this router is its own leader while on.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import TYPE_CHECKING

import msgspec

from minipd.ops.control_loop.live_controller import (
    DEFAULT_OPTIONS,
    LiveControllerOptions,
    LiveRatioController,
    MoveRecord,
)
from minipd.policy.ratio_controller import ControllerConfig, Decision
from minipd.slo.targets import SLO

if TYPE_CHECKING:
    from minipd.router.router import Router

MAX_MOVES_SHOWN = 100


class DecisionView(msgspec.Struct, frozen=True, kw_only=True):
    decided_at: float  # time.time()
    move: str  # "hold", "decode->prefill" or "prefill->decode"
    reason: str
    ttft_attainment: float | None  # None: not measured in the window
    decode_attainment: float | None


class ControllerState(msgspec.Struct, frozen=True, kw_only=True):
    on: bool
    slo: dict[str, float]  # objective -> milliseconds ({"ttft_ms": 1000.0, "itl_ms": 100.0})
    target: float
    window_s: float
    cooldown_s: float
    interval_s: float
    last_decision: DecisionView | None
    moves: list[MoveRecord]  # the latest MAX_MOVES_SHOWN, oldest first
    leader: bool = False  # this router runs the cluster's controller now
    leader_id: str | None = None  # the elected router's name (None: no election)


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


class ControllerSwitch:
    def __init__(self, router: Router, config: ControllerConfig, options: LiveControllerOptions = DEFAULT_OPTIONS):
        self.router, self.config, self.options = router, config, options
        self.controller: LiveRatioController | None = None
        self._past_moves: list[MoveRecord] = []
        self.decision_counts: Counter = Counter()  # every controller's decisions, across restarts (/metrics)
        self.election = None  # a ControllerElection when several routers share the instances
        self.scaler = None  # a LivePoolScaler (pool_scaler.py) when a launcher can add and remove instances

    @property
    def leader(self) -> bool:
        return self.on and (self.election is None or self.election.leader)

    @property
    def on(self) -> bool:
        return self.controller is not None

    def start(self) -> None:
        """Turn it on with the current policy (no-op when on); on the router's event loop."""
        if self.controller is None:
            self.controller = LiveRatioController(
                self.router,
                self.config,
                self.options,
                decision_counts=self.decision_counts,
                may_decide=lambda: self.election is None or self.election.leader,
                scaler=self.scaler,
            )
            self.controller.start()

    async def stop(self) -> None:
        """Turn it off; a move under way finishes (or times out) first."""
        controller, self.controller = self.controller, None
        if controller is not None:
            self._past_moves += controller.moves
            await controller.close()

    async def configure(self, on: bool | None = None, slo: SLO | None = None, target: float | None = None) -> None:
        """Set the policy's SLO and target (ValueError naming `slo` or `target` when the policy
        refuses them; nothing changes then) and turn the controller on or off (None: as it is).
        A running controller whose policy changed restarts with it."""
        config = self.config
        try:
            if slo is not None:
                config = msgspec.structs.replace(config, slo=slo)
        except ValueError as exc:
            raise ValueError(f"slo: {exc}") from None
        try:
            if target is not None:
                config = msgspec.structs.replace(config, target=target)
        except ValueError as exc:
            raise ValueError(f"target: {exc}") from None
        was_on = self.on
        turn_on = was_on if on is None else on
        if config != self.config and was_on:
            await self.stop()
        self.config = config
        if turn_on:
            self.start()
        else:
            await self.stop()

    def state(self) -> ControllerState:
        controller = self.controller
        moves = self._past_moves + (controller.moves if controller is not None else [])
        decision = controller.last_decision if controller is not None else None
        return ControllerState(
            on=controller is not None,
            slo=self.config.slo.as_ms(),
            target=self.config.target,
            window_s=self.config.window_s,
            cooldown_s=self.config.cooldown_s,
            interval_s=self.options.interval_s,
            last_decision=None if decision is None else self._view(decision, controller),
            moves=moves[-MAX_MOVES_SHOWN:],
            leader=self.leader,
            leader_id=None if self.election is None else self.election.leader_id,
        )

    @staticmethod
    def _view(decision: Decision, controller: LiveRatioController) -> DecisionView:
        return DecisionView(
            decided_at=time.time() - (controller.clock() - decision.time_s),
            move=decision.move.value,
            reason=decision.reason,
            ttft_attainment=_finite(decision.ttft_attainment),
            decode_attainment=_finite(decision.decode_attainment),
        )
