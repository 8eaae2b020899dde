"""One serving instance: an engine, its KV transport, and a control-plane server.

This module makes, starts, connects and shuts down an instance, and resets its pool for an
in-place role switch (role_switch.py); what it does with each message of a router, the
dispatch to its role's handler, is instance_dispatch.py's (`InstanceDispatch`, which
`Instance` inherits).

Only routers may connect (with a cluster secret, only those that prove it), and the
transport, given the same secret, takes KV only from the instance a reservation names, over
an authenticated link. Everything a router asked for through a connection is aborted when
that connection drops, and every prefill for a decode instance the router reports lost
(`PeerLost`) at once. A router's `Hello` may ask for liveness: both ends then heartbeat, and
a router silent for the liveness timeout, or one that evicts us (`Evict`), has its
connection ended: its requests aborted first (writes to peers end with them), then the
connection closed. `unrouted` is set while no router is connected (an instance started
with `--router` then registers again, entrypoints/registration.py). `shutdown(deadline_s)`
(SIGTERM) refuses new requests, tells the routers (`Draining`), lets the requests under way
finish until the deadline, and aborts the rest.
"""

from __future__ import annotations

import asyncio
import logging

from minipd.control.channel import DEFAULT_LIVENESS_TIMEOUT_S, Channel
from minipd.control.limits import DEFAULT_MAX_CONNECTIONS, max_frame_bytes
from minipd.control.messages import (
    Draining,
    Hello,
    Welcome,
)
from minipd.control.role import Role
from minipd.control.server import ControlServer
from minipd.disagg.colocated_role import ColocatedRole
from minipd.disagg.decode_role import DecodeRole
from minipd.disagg.fingerprint import engine_fingerprint
from minipd.disagg.instance_dispatch import SETTLE_TIMEOUT_S, InstanceDispatch
from minipd.disagg.kv_event_publisher import KVEventPublisher
from minipd.disagg.prefill_role import PrefillRole
from minipd.disagg.reservations import Reservations
from minipd.disagg.role_handler import RoleHandler
from minipd.disagg.role_switch import RoleGuard
from minipd.disagg.tier_wire import TierWire, open_tier_wire
from minipd.engine import cpu_placement
from minipd.engine.engine import Engine
from minipd.transports.backends import create_transport
from minipd.transports.base import Transport
from minipd.transports.shared_secret import SharedSecret, new_nonce

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 30.0


class Instance(InstanceDispatch, ControlServer):
    def __init__(
        self,
        engine: Engine,
        role: Role,
        instance_id: str,
        transport: Transport,
        model_name: str,
        lease_s: float = DEFAULT_LEASE_S,
        secret: SharedSecret | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S,
        start_epoch: int = 0,
        tier_wire: TierWire | None = None,
    ):
        super().__init__(instance_id, secret, max_connections)
        self.tier_wire = tier_wire  # the shared KV tier in the request path (tier_wire.py); None: no tier
        if not role.is_instance:
            raise ValueError(f"role: {role.value!r} is not an instance role")
        self.guard = RoleGuard(instance_id, role, start_epoch)  # role, role epoch, work in flight
        self.engine, self.instance_id = engine, instance_id
        self.transport = transport
        self.model_name = model_name
        self.lease_s = lease_s
        self.liveness_timeout_s = liveness_timeout_s
        self.fingerprint = engine_fingerprint(engine)
        self.compute = cpu_placement.compute_key(engine.config.device, engine.placement)
        # which run of this instance id this process is: in every Welcome and its registry record
        self.start_nonce = new_nonce()
        # One handler per role for the instance's life: what each keeps outlives a switch.
        self._prefill, self._decode = PrefillRole(self), DecodeRole(self)
        self._handlers: dict[Role, RoleHandler] = {
            Role.PREFILL: self._prefill,
            Role.DECODE: self._decode,
            Role.BOTH: ColocatedRole(self._prefill, self._decode),
        }
        self.reservations = Reservations(engine, transport, lease_s, instance_id, self._decode.lease_expired)
        self._routers: set[Channel] = set()  # connections of routers
        self.unrouted = asyncio.Event()  # set while no router is connected (registration watches it)
        self.unrouted.set()
        self.expired_leases: asyncio.Queue[str] = asyncio.Queue()  # request ids, for observers and tests
        self.kv_events: KVEventPublisher | None = None  # the prefix cache's changes, to routers (from `serve`)

    @property
    def routers(self) -> frozenset[Channel]:
        """The connections of the routers connected now."""
        return frozenset(self._routers)

    # ---- lifecycle --------------------------------------------------------------------
    @classmethod
    async def create(
        cls,
        engine: Engine,
        role: Role,
        instance_id: str,
        transport_name: str,
        model_name: str,
        transport_options: dict | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        secret: SharedSecret | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S,
        start_epoch: int = 0,
        kv_tier: str | None = None,
        kv_tier_fetch: str = "auto",
    ) -> "Instance":
        """`secret` also goes to the transport; `max_connections` caps the control port only.
        `kv_tier`: the shared KV tier's URL (open_tier.py), opened here (its errors raised);
        `kv_tier_fetch`: "auto" or "always" (kvtier/fetch_cost.py)."""
        transport = create_transport(
            transport_name, engine.kv_pool, instance_id=instance_id, secret=secret, **(transport_options or {})
        )
        await transport.start()
        await engine.start()
        tier_wire = None
        if kv_tier is not None:
            try:
                tier_wire = await open_tier_wire(engine, kv_tier, kv_tier_fetch)
            except BaseException:
                await engine.close()
                await transport.close()
                raise
        return cls(
            engine,
            role,
            instance_id,
            transport,
            model_name,
            lease_s,
            secret,
            max_connections,
            liveness_timeout_s,
            start_epoch,
            tier_wire,
        )

    async def serve(self, host: str, port: int) -> int:
        """Start the control-plane server; returns the bound port."""
        self.kv_events = KVEventPublisher(self.engine.block_manager)  # before a router can subscribe
        if self.tier_wire is not None:
            self.tier_wire.on_stored = self.kv_events.tier_stored
        port = await super().serve(host, port)
        self.reservations.start()
        return port

    async def close(self) -> None:
        if self.kv_events is not None:
            self.kv_events.close()
        await self.close_connections()
        await self.reservations.close()
        if self.tier_wire is not None:  # before the engine: its stores hold blocks of the pool
            await self.tier_wire.close()
        await self.engine.close()
        await self.transport.close()

    async def shutdown(self, deadline_s: float) -> bool:
        """Stop accepting, let requests under way finish within `deadline_s`, then close
        (aborting whatever is left). Returns whether everything finished in time."""
        for channel in self._routers:
            channel.send(Draining())
        finished = await self.drain(deadline_s)
        if not finished:
            log.warning("%s: shutting down with requests still under way; aborting them", self.instance_id)
            for request_id in {r for ids in self._requests_of.values() for r in ids}:
                await self.abort_request(request_id)
            await self.engine.wait_idle(SETTLE_TIMEOUT_S)  # their last outputs, saying why, go out first
        await self.close()
        return finished

    def busy(self) -> bool:
        stats = self.engine.stats()
        return super().busy() or bool(self.reservations.held) or bool(stats.num_running or stats.num_waiting)

    # ---- the handshake ----------------------------------------------------------------
    def welcome(self, hello: Hello) -> Welcome:
        return Welcome(
            instance_id=self.instance_id,
            role=self.role,
            fingerprint=self.fingerprint,
            transport=self.transport.backend,
            transport_description=self.transport.describe(),
            model_name=self.model_name,
            max_model_len=self.engine.config.scheduler.max_model_len,
            max_num_seqs=self.engine.config.scheduler.max_num_seqs,
            epoch=self.guard.epoch,
            liveness_timeout_s=self.liveness_timeout_s if hello.liveness_timeout_s > 0 else 0.0,
            compute=self.compute,
            start_nonce=self.start_nonce,
        )

    def established(self, channel: Channel, hello: Hello) -> None:
        """A router is connected: it hears of our shutdown, and heartbeats if it asked to."""
        self._routers.add(channel)
        self.unrouted.clear()
        asyncio.get_running_loop().create_task(self._forget_router(channel))
        if hello.liveness_timeout_s > 0 and self.liveness_timeout_s > 0:
            channel.watch_liveness(
                self.liveness_timeout_s,
                hello.liveness_timeout_s,
                on_silent=lambda reason: asyncio.get_running_loop().create_task(self.end_channel(channel, reason)),
            )

    async def _forget_router(self, channel: Channel) -> None:
        await channel.closed.wait()
        self._routers.discard(channel)
        if not self._routers:
            self.unrouted.set()

    def refuses_role(self, role: Role) -> str | None:
        return None if role is Role.ROUTER else f"{self.instance_id} is an instance; only a router may connect to it"

    def max_frame_bytes(self) -> int:
        return max_frame_bytes(self.engine.config.scheduler.max_model_len)

    async def _reset_pool(self) -> None:
        """Once drained: let the engine settle (aborts applied, fenced blocks back), then
        forget the prefix cache."""
        if not await self.engine.wait_idle(SETTLE_TIMEOUT_S):
            raise RuntimeError("the engine did not go idle")
        if not await self.reservations.wait_fenced(SETTLE_TIMEOUT_S):
            raise RuntimeError("blocks of aborted transfers are still fenced")
        if self.tier_wire is not None and not await self.tier_wire.drain(SETTLE_TIMEOUT_S):
            raise RuntimeError("blocks being stored in the KV tier are still held")
        self.engine.reset_pool()
