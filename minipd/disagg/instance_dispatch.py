"""What an instance does with each message of a router (every peer here is an authenticated
router): `InstanceDispatch`, the half of `instance.Instance` that serves requests (the other
half, instance.py, starts, connects, shuts down and switches it).

Its role's handler serves the work: `prefill` answers `Prefill` (prefill_role.py), `decode`
answers `Reserve` and `Decode` (decode_role.py), `both` all three (colocated_role.py), and
every role `Generate` (role_handler.py). The dispatch admits new work (not while shutting down,
nor under a stale role epoch: role_guard.py), answers a work message its role does not take
with the one refusal (`refuse_unaccepted`), and answers itself what is the same in every role:
`Abort`, `Renew`, `PeerLost`, `Evict`, `GetStats`, `SwitchRole` (role_switch.py), `SetLinkCap`
(the transport's egress cap, at runtime) and `SubscribeKVEvents` (the prefix cache's changes,
to the router's prefix index: kv_event_publisher.py).

A mixin: its state is the `Instance`'s (`engine`, `transport`, `guard`, `reservations`, the
role handlers, `tier_wire`, `kv_events`; instance.py's `__init__` makes them), and so are the
control server's calls it makes (`untrack`, `end_channel`: control/server.py).
"""

from __future__ import annotations

import logging

from minipd.control.channel import Channel
from minipd.control.messages import (
    FAILURE_SHUTDOWN,
    KV_SIDE_DECODE,
    Abort,
    Call,
    CallError,
    Decode,
    Evict,
    Generate,
    GetStats,
    Message,
    PeerLost,
    Prefill,
    Renew,
    Reserve,
    SetLinkCap,
    Stats,
    SubscribeKVEvents,
    SwitchRole,
)
from minipd.control.role import Role
from minipd.disagg.link_cap import set_link_cap
from minipd.disagg.role_handler import ROLE_MESSAGES, RoleHandler, send_failure, send_kv_failed

log = logging.getLogger(__name__)

SETTLE_TIMEOUT_S = 10.0  # a settling stats call's wait for the engine, the fences and the tier


class InstanceDispatch:
    """The message dispatch of an `Instance` (instance.py), which inherits it."""

    @property
    def role(self) -> Role:
        return self.guard.role

    @property
    def num_refused_reservations(self) -> int:
        """Reservations refused for lack of free blocks since start (this pool is the authority on its room)."""
        return self._decode.num_refused_reservations

    @property
    def handler(self) -> RoleHandler:
        """The handler of the current role: a switch changes the role, and with it this."""
        return self._handlers[self.role]

    async def handle(self, channel: Channel, message: Message) -> None:
        if isinstance(message, ROLE_MESSAGES):
            await self._route(channel, message)
            return
        match message:
            case SwitchRole():
                await self.guard.handle_switch(channel, message, self._reset_pool)
            case SetLinkCap():
                channel.reply(message, set_link_cap(self.transport, message.gbps))
            case Renew():  # like Abort, harmless when the reservation is gone (or never was here)
                self.reservations.renew(message.request_id)
            case Abort():
                await self.abort_request(message.request_id)
                self.untrack(channel, message.request_id)
            case PeerLost():  # the transport fences the peer's writes whatever the role
                peer_id, prefills = self._prefill.peer_lost(message.instance_id)
                self.transport.peer_lost(peer_id, message.reason, message.fenced)
                for request_id in prefills:  # no KV can go there
                    await self.abort_request(request_id)
            case SubscribeKVEvents():
                if self.kv_events is not None:
                    self.kv_events.subscribe(channel)
            case Evict():
                await self.end_channel(channel, f"evicted by the router: {message.reason}")
            case GetStats():
                if message.settle:
                    await self.engine.wait_idle(SETTLE_TIMEOUT_S)
                    await self.reservations.wait_fenced(SETTLE_TIMEOUT_S)
                    if self.tier_wire is not None:  # its stores hold blocks until they are through
                        await self.tier_wire.drain(SETTLE_TIMEOUT_S)
                channel.reply(message, self.stats())
            case _:
                log.warning("%s: unexpected %s", self.instance_id, type(message).__name__)

    async def _route(self, channel: Channel, message: Message) -> None:
        """Admit new work (`_refused_new_work`), then hand it to the current role's handler if
        that takes it, or refuse it (`refuse_unaccepted`). The admission checks come first: work
        sent under a stale epoch was meant for the role before a switch, and the router must
        hear that (it tries elsewhere), not that this role does not take it."""
        if not isinstance(message, Decode) and self._refused_new_work(channel, message):
            return  # a Decode is no new work: it continues a held reservation, even during a switch's drain
        handler = self.handler
        if not isinstance(message, handler.accepts):
            self.refuse_unaccepted(channel, message)
            return
        await handler.handle(channel, message)

    def _refused_new_work(self, channel: Channel, message: Reserve | Prefill | Generate) -> bool:
        """Answer new work refused while shutting down, or for its role epoch (see RoleGuard);
        True if refused. A call gets the error as its reply; a `Generate`, in place of its stream."""
        if not self.accepting:
            reason = f"{self.instance_id} is shutting down"
            if isinstance(message, Generate):
                send_failure(self, channel, message.request_id, reason, FAILURE_SHUTDOWN)
            else:
                channel.reply(message, CallError(message=reason, kind=FAILURE_SHUTDOWN))
            return True
        return self.guard.refused(channel, message)

    def refuse_unaccepted(self, channel: Channel, message: Message) -> None:
        """The one answer to a work message (ROLE_MESSAGES) the current role does not take: an
        error naming the instance, its role, the message and what the role takes. A call gets it
        as a CallError "invalid"; a `Generate` as its stream's failure; a `Decode` as `KVFailed`:
        a role without Decode holds no reservation (the instance switched roles since the
        Reserve), so the KV cannot load here, through no fault of this instance (the router's
        kv_load_failure policy applies)."""
        reason = (
            f"{self.instance_id} is a {self.role.value} instance; it does not take {type(message).__name__} "
            f"(it takes {', '.join(kind.__name__ for kind in self.handler.accepts)})"
        )
        if isinstance(message, Call):
            channel.reply(message, CallError(message=reason, kind="invalid"))
        elif isinstance(message, Decode):
            send_kv_failed(self, channel, message.request_id, reason, KV_SIDE_DECODE)
        else:
            send_failure(self, channel, message.request_id, reason)

    async def abort_request(self, request_id: str) -> None:
        self.engine.abort(request_id)
        if self.tier_wire is not None:  # a request still fetching from the tier is not submitted
            self.tier_wire.abandon(request_id)
        self._prefill.abandon(request_id)  # a prefill still connecting tells the receiver itself
        if await self.reservations.drop(request_id):
            self.guard.work.release(request_id)  # the reservation's hold (decode_role.py)
        else:
            await self.transport.abort(request_id, peer_id=self._prefill.peer_of(request_id))

    def stats(self) -> Stats:
        s = self.engine.stats()
        return Stats(
            instance_id=self.instance_id,
            role=self.role,
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            num_free_blocks=s.blocks.num_free,
            num_used_blocks=s.blocks.num_used,
            num_cached_blocks=s.blocks.num_cached,
            num_blocks=s.blocks.num_blocks,
            num_reservations=len(self.reservations.held),
            num_refused_reservations=self.num_refused_reservations,
            epoch=self.guard.epoch,
            switching=self.guard.switching,
            num_fencing_blocks=self.reservations.num_fencing_blocks,
            num_prefilling=s.num_prefilling,
            num_steps=self.engine.num_steps,
            kv_tier=None if self.tier_wire is None else self.tier_wire.report(),
        )
