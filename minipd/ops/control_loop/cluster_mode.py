"""Flip the whole cluster between colocated serving (`both` everywhere) and a P:D split, by
in-place role switches (role_switch_driver.py), one instance at a time.

`plan_mode(instances, mode, prefill)` says which instance takes which role, and in what order:
- `colocated`: every instance not `both` becomes `both` (any order: `both` keeps whatever
  the instance served, and adds the other half);
- `split` with `prefill` = N (1 <= N < instances): the N that are prefill already stay, then
  those that are `both`, then decode ones; among equals, those that were prefill before the
  last change to colocated first (so a flip there and back restores the split), then by id;
  the rest are decode. The switches into
  decode run first, so that an instance leaving decode is never the last that can decode.
`change_mode(router, ...)` carries the plan out, one switch after another: each drains what
its instance runs before it moves, and every other instance serves meanwhile, so no request
is lost. A switch that fails stops the change (the instances switched so far keep their new
roles; ModeChangeFailed names them). One change at a time (`ModeChanger`).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Mapping, Sequence

import msgspec

from minipd.control.role import Role
from minipd.engine.sampling_params import InvalidRequestError
from minipd.router.registry import InstanceHandle
from minipd.router.role_switch_driver import (
    DEFAULT_DRAIN_TIMEOUT_S,
    SwitchConflict,
    SwitchFailed,
    SwitchReport,
    UnknownInstance,
    check_drain_timeout,
)

if TYPE_CHECKING:
    from minipd.router.router import Router

COLOCATED, SPLIT = "colocated", "split"
MODES = (COLOCATED, SPLIT)


class ModeReport(msgspec.Struct, frozen=True, kw_only=True):
    mode: str
    prefill: int  # instances serving prefill only, after the change
    decode: int
    both: int
    switches: list[SwitchReport]  # in the order they were done; empty when nothing had to move
    total_s: float


class ModeChangeFailed(RuntimeError):
    """A switch of the plan failed; `done` are the switches made before it (they stay)."""

    def __init__(self, message: str, done: list[SwitchReport], cause: Exception):
        super().__init__(message)
        self.done, self.cause = done, cause


def plan_mode(
    instances: Sequence[InstanceHandle], mode: str, prefill: int | None, before: Mapping[str, Role] = {}
) -> list[tuple[str, Role]]:
    """The (instance id, new role) switches that make `instances` serve in `mode`, in order;
    InvalidRequestError naming `mode` or `prefill` for a mode or split that cannot be.
    `before`: the roles instances had before the cluster last went colocated."""
    if mode not in MODES:
        raise InvalidRequestError("mode", f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    by_id = sorted(instances, key=lambda h: h.instance_id)
    if mode == COLOCATED:
        if prefill is not None:
            raise InvalidRequestError("prefill", "only a split has a prefill count; leave it out for colocated")
        return [(h.instance_id, Role.BOTH) for h in by_id if h.role is not Role.BOTH]
    if prefill is None:
        raise InvalidRequestError("prefill", "a split needs the number of prefill instances")
    if isinstance(prefill, bool) or not 1 <= prefill < len(by_id):
        raise InvalidRequestError(
            "prefill",
            f"must leave at least one of each role: 1 to {len(by_id) - 1} of {len(by_id)} instances, got {prefill}",
        )
    preference = {Role.PREFILL: 0, Role.BOTH: 1, Role.DECODE: 2}
    ranked = sorted(
        by_id, key=lambda h: (preference[h.role], before.get(h.instance_id) is not Role.PREFILL, h.instance_id)
    )
    to_prefill = {h.instance_id for h in ranked[:prefill]}
    to_decode = [
        (h.instance_id, Role.DECODE) for h in by_id if h.instance_id not in to_prefill and h.role is not Role.DECODE
    ]
    to_prefill_moves = [
        (h.instance_id, Role.PREFILL) for h in by_id if h.instance_id in to_prefill and h.role is not Role.PREFILL
    ]
    return to_decode + to_prefill_moves


class ModeChanger:
    """One cluster mode change at a time on a router."""

    def __init__(self, router: Router):
        self.router = router
        self._lock = asyncio.Lock()
        self._before_colocated: dict[str, Role] = {}

    @property
    def changing(self) -> bool:
        return self._lock.locked()

    async def change_mode(
        self, mode: str, prefill: int | None = None, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    ) -> ModeReport:
        """Raises InvalidRequestError (`mode`, `prefill`, `drain_timeout_s`), SwitchConflict (a
        change or a switch already under way; nothing was changed) or ModeChangeFailed."""
        if self._lock.locked():
            raise SwitchConflict("mode", "a cluster mode change is already under way")
        check_drain_timeout(drain_timeout_s)
        async with self._lock:
            start = time.perf_counter()
            instances = self.router.registry.alive()
            busy = sorted(h.instance_id for h in instances if h.draining)
            if busy:
                raise SwitchConflict("mode", f"{', '.join(busy)} switching roles or shutting down; try again after")
            plan = plan_mode(instances, mode, prefill, self._before_colocated)
            if mode == COLOCATED and plan:
                self._before_colocated = {h.instance_id: h.role for h in instances}
            done: list[SwitchReport] = []
            for instance_id, role in plan:
                try:
                    done.append(await self.router.switch_role(instance_id, role, drain_timeout_s))
                except (SwitchFailed, SwitchConflict, UnknownInstance) as exc:  # lost, or moved by another meanwhile
                    moved = ", ".join(f"{r.instance_id} -> {r.to_role.value}" for r in done) or "none"
                    raise ModeChangeFailed(f"{exc}; switched before it: {moved}", done, exc) from exc
            roles = [h.role for h in self.router.registry.alive()]
            return ModeReport(
                mode=mode,
                prefill=roles.count(Role.PREFILL),
                decode=roles.count(Role.DECODE),
                both=roles.count(Role.BOTH),
                switches=done,
                total_s=time.perf_counter() - start,
            )
