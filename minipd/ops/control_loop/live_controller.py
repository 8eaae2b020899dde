"""The live P:D ratio controller: `minipd.policy`'s `RatioController` moving real instances.

Opt-in on the router (`--ratio-controller`, with `--controller-slo` and the other
`--controller-*` flags). The policy is the very object the simulator runs
(minipd/policy/ratio_controller.py); this module feeds it what the router measures and
carries out its moves. Top-down:
1. as the router relays tokens it tells this observer every first token (TTFT from the
   router's arrival, and the part spent waiting on decode: for KV room, or the whole TTFT of
   a prompt prefilled on its decode instance, since more decode is what would shorten that
   wait; see latency_observer.py) and every later token:
   judged by its gap to the request's previous token under an `itl` objective, or under a
   `tpot` objective by the request's time per output token so far, so that a stall (a
   preempted or queued sequence) counts against every token after it, as it does in TPOT;
2. every `interval_s`, each request that has waited the whole TTFT SLO without a first
   token is marked late (once; its first token is then not counted again), so an overload
   shows before its tokens come;
3. the policy decides, from the instances serving as prefill and as decode now and the
   switches still under way (sliding window, hysteresis, cool-down: see the policy);
4. a move switches one instance of the source role in place (`Router.switch_role`) in the
   background: the one that shares its hardware (`Welcome.compute`) with the fewest
   instances of the target role, since a new instance on hardware that role already uses
   adds little to it; among those, the one with the least work to drain; each move and its outcome are logged
   and kept in `moves` (the router keeps every completed switch in `role_changes`, which
   /metrics and /admin/instances show).
With a pool scaler (pool_scaler.py, on a router a scaling launcher started), step 4 is the
scaler's: it may add an instance of the wanted role instead of switching one, and it
removes an instance of a pool idle past its window. Colocated instances are never moved.
Every decision is counted by move and cause in `decision_counts`, the latest kept in
`last_decision`, and the latencies behind them in `latencies` (controller_latency.py);
/metrics shows all three (ops/admin/controller_metrics.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Callable

import msgspec

from minipd.control.role import Role
from minipd.ops.control_loop.controller_latency import ControllerLatencies
from minipd.policy.ratio_controller import ControllerConfig, Decision, Move, RatioController
from minipd.router.registry import InstanceHandle
from minipd.router.role_switch_driver import SwitchConflict, SwitchFailed, UnknownInstance

if TYPE_CHECKING:
    from minipd.ops.control_loop.pool_scaler import LivePoolScaler
    from minipd.router.router import Router

log = logging.getLogger(__name__)


def pick_mover(
    candidates: list[InstanceHandle], target: list[InstanceHandle], work: Callable[[InstanceHandle], object]
) -> InstanceHandle:
    """The candidate to move into the role of `target`: the fewest of `target` on the same
    hardware (an instance that does not say what it runs on shares with none), then the
    least `work` to drain."""

    def sharing(h: InstanceHandle) -> int:
        compute = h.welcome.compute
        return sum(1 for t in target if compute and t.welcome.compute == compute)

    return min(candidates, key=lambda h: (sharing(h), work(h)))


def _queued(h: InstanceHandle) -> tuple[int, int]:
    return h.num_inflight_tokens, h.num_inflight


class LiveControllerOptions(msgspec.Struct, frozen=True, kw_only=True):
    interval_s: float = 1.0  # how often the policy is asked
    drain_timeout_s: float = 60.0  # a move whose instance has not drained by then is given up

    def __post_init__(self) -> None:
        for field in ("interval_s", "drain_timeout_s"):
            if not getattr(self, field) > 0:
                raise ValueError(f"controller_{field}: must be positive, got {getattr(self, field)}")


DEFAULT_OPTIONS = LiveControllerOptions()


class MoveRecord(msgspec.Struct, kw_only=True):
    """One move the policy asked for, and how it went."""

    decided_at: float  # time.time()
    instance_id: str
    from_role: Role
    to_role: Role
    reason: str
    ttft_attainment: float
    decode_attainment: float
    outcome: str = "switching"  # then "switched" or why it failed
    total_s: float = 0.0
    drain_s: float = 0.0


class LiveRatioController:
    def __init__(
        self,
        router: Router,
        config: ControllerConfig,
        options: LiveControllerOptions = DEFAULT_OPTIONS,
        clock: Callable[[], float] = time.monotonic,
        decision_counts: Counter[tuple[Move, str]] | None = None,
        may_decide: Callable[[], bool] = lambda: True,
        scaler: LivePoolScaler | None = None,
    ):
        """`decision_counts`: where to count decisions (one kept across restarts), else a new one;
        `scaler`: the pool scaler that may add or remove instances (pool_scaler.py), if any."""
        self.scaler = scaler
        self.router, self.options, self.clock = router, options, clock
        self.may_decide = may_decide  # checked before each decision: False while not the elected leader
        self.policy = RatioController(config)
        self._per_request_tpot = config.slo.decode_bound[0] == "tpot"
        self.moves: list[MoveRecord] = []
        # (move, cause) -> decisions
        self.decision_counts: Counter[tuple[Move, str]] = Counter() if decision_counts is None else decision_counts
        self.last_decision: Decision | None = None  # the latest, hold or move
        self.latencies = ControllerLatencies(
            config.target, self._per_request_tpot, config.decode_wait_fraction * self.policy.ttft_bound_s
        )
        self._late: set[str] = set()  # requests reported late, whose first token is not to count
        self._in_flight = 0
        self._moving: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        router.latency_observer = self

    # ---- what the router tells it (LatencyObserver) ------------------------------------
    def first_token(self, request_id: str, now: float, ttft_s: float, decode_wait_s: float) -> None:
        if request_id in self._late:
            self._late.discard(request_id)
            return
        self.policy.observe_ttft(now, ttft_s, decode_wait_s)
        self.latencies.first_token(now, ttft_s, decode_wait_s)

    def tokens(self, now: float, gap_s: float, count: int, tpot_s: float) -> None:
        self.policy.observe_tokens(now, tpot_s if self._per_request_tpot else gap_s, count)
        self.latencies.tokens(now, gap_s, count, tpot_s)

    def latency_figures(self) -> dict[str, float | None]:
        """The estimated and observed TTFT and ITL over the policy's window now (seconds, at
        its target quantile; None without samples): see controller_latency.py."""
        return self.latencies.quantiles(self.policy.window_start(self.clock()))

    # ---- deciding ----------------------------------------------------------------------
    def tick(self) -> Decision:
        """Steps 2-4, once."""
        now = self.clock()
        waiting = self.router.awaiting_first_token()
        self._late &= {r.request_id for r in waiting}  # forget requests that ended without a token
        for routed in waiting:
            if routed.request_id not in self._late and now - routed.arrival_s > self.policy.ttft_bound_s:
                self._late.add(routed.request_id)
                self.policy.observe_late(now, routed.decode_wait_so_far(now))
                self.latencies.late(now, now - routed.arrival_s, routed.decode_wait_so_far(now))
        serving = self.router.registry.serving()
        prefill = [h for h in serving if h.role is Role.PREFILL]
        decode = [h for h in serving if h.role is Role.DECODE]
        in_flight = self._in_flight + (self.scaler.in_flight if self.scaler is not None else 0)
        decision = self.policy.decide(now, len(prefill), len(decode), in_flight)
        self.decision_counts[decision.move, decision.cause] += 1
        self.last_decision = decision
        self.latencies.prune(self.policy.window_start(now))  # bounded by the window
        log.debug(
            "ratio controller: %s (%s); ttft attainment %.2f, decode %.2f; %dP:%dD",
            decision.move.value,
            decision.reason,
            decision.ttft_attainment,
            decision.decode_attainment,
            len(prefill),
            len(decode),
        )
        if self.scaler is not None and self.scaler.step(self, now, decision):
            return decision  # the scaler adds an instance instead, or switches one itself, or holds
        self.carry_out(decision)
        return decision

    def carry_out(self, decision: Decision) -> None:
        """Start the switch a move decision asks for, with the instances serving now."""
        serving = self.router.registry.serving()
        prefill = [h for h in serving if h.role is Role.PREFILL]
        decode = [h for h in serving if h.role is Role.DECODE]
        if decision.move is Move.TO_PREFILL and decode:
            self._start(pick_mover(decode, prefill, InstanceHandle.running), Role.PREFILL, decision)
        elif decision.move is Move.TO_DECODE and prefill:
            self._start(pick_mover(prefill, decode, _queued), Role.DECODE, decision)

    def _start(self, handle: InstanceHandle, target: Role, decision: Decision) -> None:
        record = MoveRecord(
            decided_at=time.time(),
            instance_id=handle.instance_id,
            from_role=handle.role,
            to_role=target,
            reason=decision.reason,
            ttft_attainment=decision.ttft_attainment,
            decode_attainment=decision.decode_attainment,
        )
        self.moves.append(record)
        log.warning(
            "ratio controller: moving %s from %s to %s (%s)",
            handle.instance_id,
            handle.role.value,
            target.value,
            decision.reason,
        )
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._switch(record))
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)

    async def _switch(self, record: MoveRecord) -> None:
        try:
            report = await self.router.switch_role(record.instance_id, record.to_role, self.options.drain_timeout_s)
        except (SwitchConflict, SwitchFailed, UnknownInstance) as exc:
            record.outcome = f"failed: {exc}"
            log.warning("ratio controller: %s stays a %s instance: %s", record.instance_id, record.from_role.value, exc)
        else:
            record.outcome, record.total_s, record.drain_s = "switched", report.total_s, report.drain_s
            log.warning(
                "ratio controller: %s is a %s instance now (%.2f s, %.2f s of it draining)",
                record.instance_id,
                record.to_role.value,
                report.total_s,
                report.drain_s,
            )
        finally:
            self._in_flight -= 1

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.options.interval_s)  # the policy's period, not a synchronisation
            try:
                if self.may_decide():
                    self.tick()
            except Exception:  # a failing decision must not stop the controller (nor the router)
                log.exception("ratio controller: decision failed")

    async def close(self) -> None:
        """Stop deciding; switches under way finish (or time out) first."""
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self._moving:
            await asyncio.gather(*self._moving, return_exceptions=True)
        if self.router.latency_observer is self:
            self.router.latency_observer = None
