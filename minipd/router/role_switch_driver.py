"""The router's half of an in-place role switch (the instance's half: disagg/role_switch.py).

`switch_instance_role(registry, instance_id, role)`, top-down (it needs the router's instance
registry only; the router records the report):
1. check the request: a known, live instance (else UnknownInstance), an instance role (else
   InvalidRequestError naming `role`), not its role already, not switching already, and not
   the last instance that can decode when the new role cannot (else SwitchConflict);
2. claim the switch (`claims`: with a registry, only one router wins it, epoch_cas.py; else
   SwitchConflict), held until the switch ended;
3. mark the handle draining: from the decision on, no new work picks it (a try that picked
   it just before is refused by the instance for its stale epoch and retried elsewhere);
4. `SwitchRole` with the epoch the router knows: the instance drains, resets its pool and
   answers with its new role and epoch, or refuses and serves on as before: SwitchConflict
   when it refuses for a stale epoch (another router switched it since this one looked),
   SwitchFailed otherwise;
5. the handle takes the new role and epoch and forgets the prefixes it remembered; the
   instance is picked for work of its new role from the next request on.
The report times the whole switch from the decision (step 1) to step 5, and the instance's
drain and reset within it.
"""

from __future__ import annotations

import logging
import time

import msgspec

from minipd.control.channel import ChannelClosed, RemoteError
from minipd.control.messages import STALE_EPOCH, RoleSwitched, SwitchRole
from minipd.control.role import INSTANCE_ROLES, Role
from minipd.engine.sampling_params import InvalidRequestError
from minipd.router.registry import InstanceRegistry
from minipd.router.switch_claims import LOCAL_CLAIMS, SwitchClaims

log = logging.getLogger(__name__)

DEFAULT_DRAIN_TIMEOUT_S = 120.0
MAX_DRAIN_TIMEOUT_S = 3600.0  # a drain waits for requests under way: an hour is past any of them
REPLY_MARGIN_S = 30.0  # beyond the drain timeout, for the pool reset and the reply to arrive


class UnknownInstance(LookupError):
    """No live instance of that id is registered."""

    def __init__(self, instance_id: str, known: list[str]):
        super().__init__(f"instance: no live instance {instance_id!r}; known: {', '.join(known) or 'none'}")
        self.instance_id = instance_id


class SwitchConflict(RuntimeError):
    """The switch cannot be done in the cluster's current state (nothing was changed);
    `field` names the input at odds with it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class SwitchFailed(RuntimeError):
    """The instance did not switch; it serves as before if alive. `kind`: the instance's
    CallError kind (DRAIN_TIMEOUT when its drain outlasted the timeout), or "lost"."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


class SwitchReport(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    from_role: Role
    to_role: Role
    epoch: int  # the new role epoch
    decided_at: float  # time.time() of the decision
    total_s: float  # decision to serving in the new role, drain included
    drain_s: float  # the instance waiting for its in-flight work
    reset_s: float  # the instance resetting its pool and taking the new role
    num_drained: int  # requests in flight on it when it began draining

    @property
    def excluding_drain_s(self) -> float:
        """Decision to serving in the new role, less the drain: the cost of the switch itself."""
        return self.total_s - self.drain_s


def check_drain_timeout(drain_timeout_s: float) -> None:
    """A drain timeout in (0, MAX_DRAIN_TIMEOUT_S] seconds; InvalidRequestError naming `drain_timeout_s` otherwise."""
    if not 0 < drain_timeout_s <= MAX_DRAIN_TIMEOUT_S:  # NaN fails both comparisons
        raise InvalidRequestError(
            "drain_timeout_s", f"must be positive and at most {MAX_DRAIN_TIMEOUT_S:g} seconds, got {drain_timeout_s}"
        )


def parse_role(role: Role | str) -> Role:
    """An instance role from its value; InvalidRequestError naming `role` otherwise."""
    choices = ", ".join(r.value for r in INSTANCE_ROLES)
    try:
        parsed = role if isinstance(role, Role) else Role(role)
    except ValueError:
        raise InvalidRequestError("role", f"unknown role {role!r}; choose one of {choices}") from None
    if not parsed.is_instance:
        raise InvalidRequestError("role", f"{parsed.value!r} is not an instance role; choose one of {choices}")
    return parsed


async def switch_instance_role(
    registry: InstanceRegistry,
    instance_id: str,
    role: Role | str,
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    claims: SwitchClaims = LOCAL_CLAIMS,
) -> SwitchReport:
    start, decided_at = time.perf_counter(), time.time()
    handle = registry.instances.get(instance_id)
    if handle is None or not handle.is_alive:
        raise UnknownInstance(instance_id, sorted(h.instance_id for h in registry.alive()))
    target = parse_role(role)
    check_drain_timeout(drain_timeout_s)
    if handle.draining:
        raise SwitchConflict("instance", f"{instance_id} is already switching roles")
    if handle.role is target:
        raise SwitchConflict("role", f"{instance_id} is already a {target.value} instance")
    if (
        handle.role.serves_decode
        and not target.serves_decode
        and not [h for h in registry.decode_candidates() if h is not handle]
    ):
        raise SwitchConflict(
            "role", f"{instance_id} is the last instance that can decode; the cluster could not serve without it"
        )
    previous, epoch = handle.role, handle.epoch
    async with claims.claim(instance_id, epoch, target):
        handle.draining = True
        log.info("switching %s from %s to %s", instance_id, previous.value, target.value)
        try:
            reply: RoleSwitched = await handle.channel.call(
                SwitchRole(role=target, epoch=epoch, drain_timeout_s=drain_timeout_s),
                drain_timeout_s + REPLY_MARGIN_S,
            )
        except RemoteError as exc:
            if exc.kind == STALE_EPOCH:
                # another router switched it after this one's view (and its claim's read of the
                # registry, which the instance republishes after the switch): a conflict, and
                # nothing was changed
                raise SwitchConflict(
                    "instance", f"{instance_id} was switched meanwhile by another router: {exc}"
                ) from exc
            raise SwitchFailed(f"{instance_id} did not switch to {target.value}: {exc}", exc.kind) from exc
        except (ChannelClosed, TimeoutError) as exc:
            raise SwitchFailed(f"{instance_id} did not switch to {target.value}: {exc}", "lost") from exc
        finally:
            handle.draining = False
        handle.take_role(reply.role, reply.epoch)
    report = SwitchReport(
        instance_id=instance_id,
        from_role=previous,
        to_role=reply.role,
        epoch=reply.epoch,
        decided_at=decided_at,
        total_s=time.perf_counter() - start,
        drain_s=reply.drain_s,
        reset_s=reply.reset_s,
        num_drained=reply.num_drained,
    )
    log.info(
        "%s is now a %s instance (epoch %d): %.3f s in all, %.3f s of it draining %d requests",
        instance_id,
        reply.role.value,
        reply.epoch,
        report.total_s,
        report.drain_s,
        report.num_drained,
    )
    return report
