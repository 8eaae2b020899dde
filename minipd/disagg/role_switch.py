"""An instance's role, the role epoch that guards it, and the in-place switch between roles.

Every role comes with an epoch, a counter bumped by each switch. The router learns it from
the handshake (`Welcome.epoch`), the stats and `RoleSwitched`, and sends the epoch it saw
with every new piece of work (`Reserve`, `Prefill`, `Generate`). New work is refused with
`CallError(kind=STALE_EPOCH)` while a switch drains the instance, and afterwards whenever it
carries an older epoch: it was meant for the old role. The router then tries elsewhere, so no
request is ever served in a role it was not sent for.

A switch, top-down (`RoleGuard.switch`):
1. refuse it when the sender's epoch is stale (someone switched the instance since), a
   switch is already under way, or the target is not an instance role;
2. stop taking new work (step "refuse" above);
3. drain: wait until the work in flight has ended: a held reservation until its decode
   stream finishes (a `Decode` for a held reservation is still served), a `Prefill` until
   its KV is sent, a `Generate` until its stream finishes. Bounded by the drain timeout; on
   timeout the switch is cancelled and the instance serves on in its old role and epoch;
4. reset: the engine's pool forgets its prefix cache and every block is free (checked);
5. take the new role and bump the epoch.
The weights, the pool's memory, the KV transport and the control connections stay.
"""

from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable

from minipd.control.channel import Channel
from minipd.control.messages import (
    DRAIN_TIMEOUT,
    STALE_EPOCH,
    CallError,
    RoleSwitched,
    SwitchRole,
)
from minipd.control.role import INSTANCE_ROLES, Role
from minipd.disagg.role_guard import InFlightWork as InFlightWork  # the work a switch drains
from minipd.disagg.role_guard import WorkAdmission

log = logging.getLogger(__name__)


class SwitchRefused(Exception):
    """The switch did not happen; `kind` is the CallError kind to answer with."""

    def __init__(self, message: str, kind: str = "invalid"):
        super().__init__(message)
        self.kind = kind


class RoleGuard(WorkAdmission):
    """The role and epoch of one instance, what may run under them (role_guard.py), and the
    in-place switch between roles (steps 1-5 of the module docstring)."""

    async def handle_switch(self, channel: Channel, message: SwitchRole, reset: Callable[[], Awaitable[None]]) -> None:
        """Answer `SwitchRole`: `RoleSwitched` once done, or the refusal."""
        try:
            switched = await self.switch(message.role, message.epoch, message.drain_timeout_s, reset)
        except SwitchRefused as exc:
            log.warning("%s: role switch to %s refused: %s", self.instance_id, message.role.value, exc)
            channel.reply(message, CallError(message=str(exc), kind=exc.kind))
            return
        log.info(
            "%s: now a %s instance (epoch %d; drained in %.3f s, reset in %.3f s)",
            self.instance_id,
            switched.role.value,
            switched.epoch,
            switched.drain_s,
            switched.reset_s,
        )
        channel.reply(message, switched)

    async def switch(
        self, target: Role, sender_epoch: int, drain_timeout_s: float, reset: Callable[[], Awaitable[None]]
    ) -> RoleSwitched:
        """Steps 1-5 of the module docstring; `reset` empties the pool (step 4) and raises if
        it cannot. Raises SwitchRefused (the instance then serves on as before)."""
        if not isinstance(target, Role) or not target.is_instance:
            raise SwitchRefused(
                f"role: {getattr(target, 'value', target)!r} is not an instance role; choose one "
                f"of {', '.join(r.value for r in INSTANCE_ROLES)}"
            )
        if self.switching_to is not None:
            # the kind of new work refused while switching: whoever sent it has a view the switch
            # is about to make stale (the router answers it as a conflict, not a failure)
            raise SwitchRefused(
                f"{self.instance_id} is already switching to {self.switching_to.value}", kind=STALE_EPOCH
            )
        if sender_epoch != self.epoch:
            raise SwitchRefused(
                f"{self.instance_id}: role epoch {sender_epoch} is stale (now {self.epoch}, a "
                f"{self.role.value} instance)",
                kind=STALE_EPOCH,
            )
        if not drain_timeout_s > 0:
            raise SwitchRefused(f"drain_timeout_s: must be positive, got {drain_timeout_s}")
        previous = self.role
        start = time.perf_counter()
        num_drained = len(self.work)
        self.switching_to = target
        self.draining.set()
        try:
            if not await self.work.wait_none(drain_timeout_s):
                raise SwitchRefused(
                    f"{self.instance_id}: {len(self.work)} requests still in flight after the "
                    f"{drain_timeout_s:g} s drain timeout; it stays a {previous.value} instance",
                    kind=DRAIN_TIMEOUT,
                )
            drained = time.perf_counter()
            try:
                await reset()
            except RuntimeError as exc:
                raise SwitchRefused(f"{self.instance_id}: the pool could not be reset: {exc}", kind="error") from exc
            self.role, self.epoch = target, self.epoch + 1
        finally:
            self.switching_to = None
            self.draining.clear()
        for listener in self.on_switched:  # e.g. the registry publisher (ops/registry/publisher.py)
            listener()
        return RoleSwitched(
            role=target,
            epoch=self.epoch,
            previous_role=previous,
            drain_s=drained - start,
            reset_s=time.perf_counter() - drained,
            num_drained=num_drained,
        )
