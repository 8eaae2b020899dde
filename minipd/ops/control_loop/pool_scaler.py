"""The live pool scaler: the ratio controller adds and removes instances, not only switches them.

Present on a router that a scaling launcher started (`minipd --role cluster --launcher ray`
with pool bounds: entrypoints/ray_scaling.py), reached over its `ScaleLink` (scale_link.py;
this module imports no Ray). The decisions are minipd/policy/pool_scaling.py's; this module
feeds it and carries them out. At every decision of the ratio controller (live_controller.py
calls `step`):
1. each pool's business is observed: a request on any of its instances (routed there and
   not finished), or one routed there since the last look (a prefill of a short prompt
   starts and ends between two decisions), makes it busy;
2. when the decision wants another instance of a role, the launcher is asked whether one
   more fits (`room`), and the policy says: add one (the launcher places it, starts it and
   registers it with this router), switch one in place (the ratio controller's own move), or
   hold; the controller does not switch by itself then;
3. otherwise, a pool idle past the idle window and above its minimum gives an instance back:
   the one with the least work (among equals, the highest id: the newest), which is drained
   (marked draining, so nothing new is routed there, then waited on until every request
   routed there finished, within the drain timeout; one that does not drain serves on), then
   stopped by the launcher (its process shuts down gracefully) and forgotten (not redialed).
One scale action runs at a time (`in_flight`), during which the controller holds. Every event
is logged, kept in `events` (its state moving from adding to added, or draining, removing,
removed; failed with why), counted when done in `counts` and when failed in `failures`;
/admin/instances and /metrics show them (ops/admin/admin.py, ops/admin/scale_metrics.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Callable, Protocol

import msgspec

from minipd.control.role import Role
from minipd.ops.control_loop.scale_link import ScaleLink, ScaleLinkError
from minipd.policy.pool_scaling import PoolScaler, ScaleAction, ScaleDecision, ScalingConfig, wanted
from minipd.policy.ratio_controller import Decision, RatioController
from minipd.router.registry import InstanceHandle

if TYPE_CHECKING:
    from minipd.router.router import Router

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05  # how often a draining instance's routed requests are counted
GONE_TIMEOUT_S = 60.0  # for a stopped instance's connection to close
MAX_EVENTS_KEPT = 200
SCALED_ROLES = (Role.PREFILL, Role.DECODE)


class ScaledController(Protocol):
    """What the scaler uses of the ratio controller it works for (live_controller.py)."""

    policy: RatioController  # whose window restarts when a pool changed size

    def carry_out(self, decision: Decision) -> None:
        """Switch one instance as the move `decision` asks."""


class ScaleEvent(msgspec.Struct, kw_only=True):
    """One add or remove, and how it went."""

    decided_at: float  # time.time()
    action: str  # "add" or "remove"
    role: str
    reason: str
    instance: str | None = None  # known once added; the one drained for a remove
    state: str  # adding -> added; draining -> removing -> removed; or failed
    detail: str = ""  # why it failed; where an added one listens
    total_s: float = 0.0  # decision to done


class LivePoolScaler:
    def __init__(
        self,
        router: Router,
        link: ScaleLink,
        config: ScalingConfig,
        drain_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.router, self.link, self.config, self.clock = router, link, config, clock
        self.drain_timeout_s = drain_timeout_s
        self.policy = PoolScaler(config)
        self.events: list[ScaleEvent] = []
        self._routed_seen: dict[str, int] = {}  # each instance's num_routed at the last look
        self.counts: Counter[tuple[str, str]] = Counter()  # (action, role) -> done
        self.failures: Counter[tuple[str, str]] = Counter()
        self.removing: set[str] = set()  # instances draining to be removed
        self.last_hold: ScaleDecision | None = None
        self._task: asyncio.Task | None = None

    @property
    def in_flight(self) -> int:
        return int(self._task is not None and not self._task.done())

    def pool_sizes(self) -> dict[Role, int]:
        """Instances serving in each role now (draining ones excluded)."""
        serving = self.router.registry.serving()
        return {role: sum(1 for h in serving if h.role is role) for role in (*SCALED_ROLES, Role.BOTH)}

    def _busy(self) -> dict[Role, bool]:
        """Per scaled role: a request runs on one of its instances, or one was routed there since
        the last call."""
        alive = self.router.registry.alive()
        busy = {role.value: False for role in SCALED_ROLES}
        for h in alive:
            routed_since = h.num_routed != self._routed_seen.get(h.instance_id, 0)
            self._routed_seen[h.instance_id] = h.num_routed
            if h.role.value in busy and (h.num_inflight or routed_since):
                busy[h.role.value] = True
        return busy

    def _sizes(self) -> dict[str, int]:
        """`pool_sizes` as the policy counts them (by role name)."""
        return {role.value: n for role, n in self.pool_sizes().items()}

    # ---- the controller's hook ---------------------------------------------------------
    def step(self, controller: ScaledController, now: float, decision: Decision) -> bool:
        """After each decision: observe the pools, and start a scale action if one is due.
        True when the scaler takes the decision over (the controller must not switch)."""
        self.policy.observe(now, self._busy())
        if self.in_flight:
            return decision.move.moves
        role, switch_allowed = wanted(decision)
        if role is None:
            shrink = self.policy.shrink(now, self._sizes())
            if shrink.action is ScaleAction.REMOVE:
                self._begin(self._remove(controller, shrink))
            return False
        self._begin(self._grow(controller, decision, role, switch_allowed))
        return True

    def _begin(self, work) -> None:
        self._task = asyncio.get_running_loop().create_task(work)

    # ---- adding ------------------------------------------------------------------------
    async def _grow(self, controller: ScaledController, decision: Decision, role: str, switch_allowed: bool):
        try:
            room = (await self.link.call("room")).room or {}
        except ScaleLinkError as exc:
            log.warning("pool scaler: could not ask the launcher for room: %s", exc)
            room = {}
        choice = self.policy.grow(self.clock(), role, switch_allowed, self._sizes(), room.get(role, False))
        if choice.action is ScaleAction.ADD:
            await self._add(controller, choice)
        elif choice.action is ScaleAction.SWITCH:
            controller.carry_out(decision)
        else:
            self.last_hold = choice
            log.info("pool scaler: holding: %s", choice.reason)

    async def _add(self, controller: ScaledController, choice: ScaleDecision) -> None:
        role = choice.role
        event = self._event("add", role, choice.reason, "adding")
        log.warning("pool scaler: adding a %s instance (%s)", role, choice.reason)
        started = time.perf_counter()
        try:
            reply = await self.link.call("add", role=role)
        except ScaleLinkError as exc:
            self._failed(event, str(exc))
            return
        event.instance, event.detail = reply.instance, f"at {reply.address}"
        event.state, event.total_s = "added", time.perf_counter() - started
        self.counts["add", role] += 1
        self.policy.done(self.clock(), choice.role)
        controller.policy.note_pool_change(self.clock())
        log.warning("pool scaler: added %s (%s) at %s in %.1f s", reply.instance, role, reply.address, event.total_s)

    # ---- removing ----------------------------------------------------------------------
    def _pick(self, role: Role) -> InstanceHandle | None:
        """The instance of `role` to remove: the least work, then the highest id; None when
        removing any would leave the cluster without an instance that can decode."""
        candidates = sorted(
            (h for h in self.router.registry.serving() if h.role is role), key=lambda h: h.instance_id, reverse=True
        )
        if not candidates:
            return None
        handle = min(candidates, key=lambda h: (h.num_inflight, h.running()))
        others_decode = [h for h in self.router.registry.decode_candidates() if h is not handle]
        return handle if others_decode or not handle.role.serves_decode else None

    async def _remove(self, controller: ScaledController, choice: ScaleDecision) -> None:
        role = choice.role
        handle = self._pick(Role(role))
        if handle is None:
            log.info("pool scaler: no %s instance may be removed now", role)
            return
        name = handle.instance_id
        event = self._event("remove", role, choice.reason, "draining", name)
        log.warning("pool scaler: removing %s (%s): draining it", name, choice.reason)
        started = time.perf_counter()
        handle.draining = True  # nothing new is routed there from now on
        self.removing.add(name)
        try:
            if not await self._drained(handle):
                handle.draining = False
                self._failed(event, f"{name} did not drain within {self.drain_timeout_s:g} s; it serves on")
                return
            event.state = "removing"
            self.router.links.forget(handle.address)  # stopped for good: not redialed, its end no loss
            try:
                await self.link.call("remove", instance=name)
            except ScaleLinkError as exc:
                handle.draining = False
                self.router.links.keep(handle.address)
                self._failed(event, str(exc))
                return
            try:
                await asyncio.wait_for(handle.channel.closed.wait(), GONE_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("pool scaler: %s was stopped, but its connection stays open", name)
            event.state, event.total_s = "removed", time.perf_counter() - started
            self.counts["remove", role] += 1
            self.policy.done(self.clock(), choice.role)
            controller.policy.note_pool_change(self.clock())
            log.warning("pool scaler: removed %s (%s) in %.1f s", name, role, event.total_s)
        finally:
            self.removing.discard(name)

    async def _drained(self, handle: InstanceHandle) -> bool:
        """Every request routed to `handle` finished, within the drain timeout."""
        deadline = time.monotonic() + self.drain_timeout_s
        while handle.num_inflight and handle.is_alive:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(DRAIN_POLL_S)  # a bounded wait on the router's own count
        return True

    # ---- records -----------------------------------------------------------------------
    def _event(self, action: str, role: str, reason: str, state: str, instance: str | None = None) -> ScaleEvent:
        event = ScaleEvent(
            decided_at=time.time(), action=action, role=role, reason=reason, state=state, instance=instance
        )
        self.events.append(event)
        del self.events[:-MAX_EVENTS_KEPT]
        return event

    def _failed(self, event: ScaleEvent, why: str) -> None:
        event.state, event.detail = "failed", why
        self.failures[event.action, event.role] += 1
        log.warning("pool scaler: %s of a %s instance failed: %s", event.action, event.role, why)

    async def close(self) -> None:
        """Stop: a scale action under way is abandoned (the launcher finishes or undoes it)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.link.close()


async def scaler_from_launcher(router: Router, switch) -> LivePoolScaler | None:
    """The pool scaler of a router started by a launcher that scales pools (its `ScaleLink` in
    the environment), attached to the ratio controller's `switch` (controller_switch.py), whose
    switches then keep the pools' minimums too; None for any other router. ScaleLinkError when
    the launcher does not say how to scale."""
    link = await ScaleLink.from_env()
    if link is None:
        return None
    try:
        config = (await link.call("hello")).config
        if config is None:
            raise ScaleLinkError("the launcher sent no scaling config")
    except BaseException:
        await link.close()
        raise
    bounds = config.bounds
    scaler = LivePoolScaler(router, link, config, switch.options.drain_timeout_s)
    switch.scaler = scaler
    switch.config = msgspec.structs.replace(switch.config, min_prefill=bounds.min_prefill, min_decode=bounds.min_decode)
    log.warning(
        "pool scaler: prefill %d..%d, decode %d..%d instances, idle window %g s, cool-down %g s "
        "(acting while the ratio controller is on)",
        bounds.min_prefill,
        bounds.max_prefill,
        bounds.min_decode,
        bounds.max_decode,
        config.idle_window_s,
        config.cooldown_s,
    )
    return scaler
