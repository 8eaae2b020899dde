"""One serving instance: an engine, its KV transport, and a control-plane server.

Roles: `prefill` answers `Prefill` (compute the prompt, stream the KV to a decode instance);
`decode` answers `Reserve` and `Decode` (hold blocks, receive the KV, decode); every role
answers `Generate` (prefill and decode here, used for colocated serving and for short
prompts), `Abort`, `PeerLost`, `GetStats` and `SwitchRole` (an in-place role switch; new
work carries the role epoch it was meant for, see role_switch.py). Only routers may connect
(with a cluster secret, only those that prove it), and the transport, given the same secret,
takes KV only from the instance a reservation names, over an authenticated link. What a
router asked for through a connection is aborted when that connection drops, and every
prefill for a decode instance the router reports lost (`PeerLost`) at once.

Length: one class answers every role's calls, and the roles share its transport, reservations
and connections; splitting it by role is due once those are settled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import NamedTuple

from minipd.transports.base import Transport
from minipd.transports.errors import TransferError
from minipd.transports.registry import create_transport

from minipd.control.channel import Channel
from minipd.control.role import Role
from minipd.control.limits import DEFAULT_MAX_CONNECTIONS, max_frame_bytes
from minipd.control.messages import (Abort, CallError, Decode, Generate, GetStats, KVLanded, Message,
                                     PeerLost, Prefill, Prefilled, Renew, Reserve, Reserved, Stats, SwitchRole,
                                     TokenOutput, Welcome)
from minipd.control.server import ControlServer
from minipd.transports.shared_secret import SharedSecret
from minipd.engine.engine import Engine, NoCapacity
from minipd.disagg.fingerprint import engine_fingerprint
from minipd.disagg.layerwise_sender import LayerwiseKVSender
from minipd.disagg.role_switch import RoleGuard
from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 30.0
DEFAULT_LAND_TIMEOUT_S = 30.0
DEFAULT_PREFILL_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 10.0


class Reservation(NamedTuple):
    token_ids: list[int]
    block_ids: list[int]
    num_cached_tokens: int
    deadline: float  # time.monotonic()


class Instance(ControlServer):
    def __init__(self, engine: Engine, role: Role, instance_id: str, transport: Transport,
                 model_name: str, lease_s: float = DEFAULT_LEASE_S, secret: SharedSecret | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS):
        super().__init__(instance_id, secret, max_connections)
        if not role.is_instance:
            raise ValueError(f"role: {role.value!r} is not an instance role")
        self.guard = RoleGuard(instance_id, role)  # role, role epoch, work in flight
        self.engine, self.instance_id = engine, instance_id
        self.transport = transport
        self.model_name = model_name
        self.lease_s = lease_s
        self.fingerprint = engine_fingerprint(engine)
        self.reservations: dict[str, Reservation] = {}
        self._peer_ids: dict[str, str] = {}  # decode instance id -> transport peer id
        self._connecting: dict[str, asyncio.Task] = {}
        self._prefills_to: dict[str, set[str]] = {}  # decode instance id -> ids of prefills for it
        self._lease_task: asyncio.Task | None = None
        self.expired_leases: asyncio.Queue[str] = asyncio.Queue()  # request ids, for observers and tests

    @property
    def role(self) -> Role:
        return self.guard.role

    # ---- lifecycle --------------------------------------------------------------------
    @classmethod
    async def create(cls, engine: Engine, role: Role, instance_id: str, transport_name: str, model_name: str,
                     transport_options: dict | None = None, lease_s: float = DEFAULT_LEASE_S,
                     secret: SharedSecret | None = None, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> "Instance":
        """`secret` also goes to the transport; `max_connections` caps the control port only."""
        transport = create_transport(transport_name, engine.kv_pool, instance_id=instance_id, secret=secret,
                                     **(transport_options or {}))
        await transport.start()
        await engine.start()
        return cls(engine, role, instance_id, transport, model_name, lease_s, secret, max_connections)

    async def serve(self, host: str, port: int) -> int:
        """Start the control-plane server; returns the bound port."""
        port = await super().serve(host, port)
        self._lease_task = asyncio.get_running_loop().create_task(self._expire_leases())
        return port

    async def close(self) -> None:
        if self._lease_task is not None:
            self._lease_task.cancel()
        await self.close_connections()
        for request_id in list(self.reservations):
            await self._drop_reservation(request_id)
        await self.engine.close()
        await self.transport.close()

    # ---- the handshake ----------------------------------------------------------------
    def welcome(self) -> Welcome:
        return Welcome(instance_id=self.instance_id, role=self.role, fingerprint=self.fingerprint,
                       transport=self.transport.backend, transport_description=self.transport.describe(),
                       model_name=self.model_name, max_model_len=self.engine.config.max_model_len,
                       max_num_seqs=self.engine.config.max_num_seqs, epoch=self.guard.epoch)

    def refuses_role(self, role: Role) -> str | None:
        return None if role is Role.ROUTER else f"{self.instance_id} is an instance; only a router may connect to it"

    def max_frame_bytes(self) -> int:
        return max_frame_bytes(self.engine.config.max_model_len)

    # ---- dispatch (every peer here is an authenticated router) -------------------------
    async def handle(self, channel: Channel, message: Message) -> None:
        match message:
            case Reserve():
                if self.guard.refused(channel, message):
                    return
                self.track(channel, message.request_id)
                self._reserve(channel, message)
            case Prefill():
                if self.guard.refused(channel, message):
                    return
                self.track(channel, message.request_id)
                with self.guard.work.holding(message.request_id):
                    await self._prefill(channel, message)
            case Decode():  # for a reservation held since Reserve: served during a switch's drain too
                try:
                    await self._decode(channel, message)
                finally:
                    self.guard.work.release(message.request_id)
            case Generate():
                if self.guard.refused(channel, message):
                    return
                self.track(channel, message.request_id)
                with self.guard.work.holding(message.request_id):
                    await self._generate(channel, message)
            case SwitchRole():
                await self.guard.handle_switch(channel, message, self._reset_pool)
            case Renew():
                self._renew(message.request_id)
            case Abort():
                await self.abort_request(message.request_id)
            case PeerLost():
                self.transport.peer_lost(message.instance_id, message.reason)
                self._peer_ids.pop(message.instance_id, None)
                for request_id in self._prefills_to.pop(message.instance_id, set()):  # no KV can go there
                    await self.abort_request(request_id)
            case GetStats():
                if message.settle:
                    await self.engine.wait_idle(SETTLE_TIMEOUT_S)
                channel.reply(message, self.stats())
            case _:
                log.warning("%s: unexpected %s", self.instance_id, type(message).__name__)

    async def _reset_pool(self) -> None:
        """Once drained: let the engine settle (aborts applied), then forget the prefix cache."""
        if not await self.engine.wait_idle(SETTLE_TIMEOUT_S):
            raise RuntimeError("the engine did not go idle")
        self.engine.reset_pool()

    def _refuse(self, serves: bool, what: str, channel: Channel, message) -> bool:
        """Answer a call this instance's role does not serve with an error; True if refused."""
        if serves:
            return False
        channel.reply(message, CallError(message=f"{self.instance_id} is a {self.role.value} instance; it does "
                                                 f"not serve {what}", kind="invalid"))
        return True

    # ---- decode role ------------------------------------------------------------------
    def _reserve(self, channel: Channel, message: Reserve) -> None:
        if self._refuse(self.role.serves_decode, "decode", channel, message):
            return
        request_id = message.request_id
        try:
            if request_id in self.reservations:
                raise InvalidRequestError("request_id", f"{request_id!r} already holds a reservation")
            block_ids, num_cached = self.engine.reserve(message.token_ids)
        except NoCapacity as exc:
            channel.reply(message, CallError(message=str(exc), kind="busy"))
            return
        except InvalidRequestError as exc:
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
            return
        dst = block_ids[num_cached // self.engine.config.block_size:]
        try:
            self.transport.expect(request_id, message.prefill_instance, dst)
        except ValueError as exc:
            self.engine.release_blocks(block_ids)
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
            return
        self.reservations[request_id] = Reservation(message.token_ids, block_ids, num_cached,
                                                    time.monotonic() + self.lease_s)
        self.guard.work.hold(request_id)  # until its decode stream ends or the reservation is dropped
        channel.reply(message, Reserved(num_cached_tokens=num_cached, dst_block_ids=dst, lease_s=self.lease_s))

    async def _decode(self, channel: Channel, message: Decode) -> None:
        request_id = message.request_id
        reservation = self.reservations.pop(request_id, None)
        if reservation is None:
            self._send_failure(channel, request_id, "no reservation (expired or aborted)")
            return
        try:
            landed = await self.transport.wait_landed(request_id, DEFAULT_LAND_TIMEOUT_S)
        except TransferError as exc:  # the blocks are still ours
            self.engine.release_blocks(reservation.block_ids)
            channel.send(KVLanded(request_id=request_id, error=str(exc)))
            self._send_failure(channel, request_id, f"{type(exc).__name__}: {exc}")
            return
        channel.send(KVLanded(request_id=request_id, landed_at=landed.landed_at))
        try:
            stream = self.engine.adopt(reservation.token_ids, reservation.block_ids, reservation.num_cached_tokens,
                                       message.first_token, message.sampling, request_id)
        except InvalidRequestError as exc:
            self.engine.release_blocks(reservation.block_ids)
            self._send_failure(channel, request_id, f"{type(exc).__name__}: {exc}")
            return
        await self._forward(channel, stream)

    def _renew(self, request_id: str) -> None:
        reservation = self.reservations.get(request_id)
        if reservation is not None:
            self.reservations[request_id] = reservation._replace(deadline=time.monotonic() + self.lease_s)

    async def _drop_reservation(self, request_id: str) -> bool:
        reservation = self.reservations.pop(request_id, None)
        if reservation is None:
            return False
        try:
            await self.transport.abort(request_id)
        except Exception:  # cannot guarantee the peer stopped writing: keep the blocks out of use
            log.exception("%s: abort of %s did not drain; leaking its blocks", self.instance_id, request_id)
            return True
        else:
            self.engine.release_blocks(reservation.block_ids)
            return True
        finally:
            self.guard.work.release(request_id)

    async def _expire_leases(self) -> None:
        while True:
            await asyncio.sleep(max(self.lease_s / 4, 0.05))  # a periodic sweep, not a synchronisation
            now = time.monotonic()
            for request_id, reservation in list(self.reservations.items()):
                if reservation.deadline <= now:
                    log.info("%s: lease of %s expired", self.instance_id, request_id)
                    await self._drop_reservation(request_id)
                    self.expired_leases.put_nowait(request_id)

    # ---- prefill role -----------------------------------------------------------------
    async def _prefill(self, channel: Channel, message: Prefill) -> None:
        if self._refuse(self.role.serves_prefill, "prefill", channel, message):
            return
        request_id = message.request_id
        differences = self.fingerprint.differences(message.decode_fingerprint)
        if differences:
            channel.reply(message, CallError(message=f"{message.decode_instance} is incompatible with "
                                                     f"{self.instance_id}: {'; '.join(differences)}", kind="invalid"))
            self.untrack(channel, request_id)
            return
        self._prefills_to.setdefault(message.decode_instance, set()).add(request_id)
        try:
            peer_id = await self._peer(message.decode_instance, message.decode_description)
            sender = LayerwiseKVSender(self.engine, self.transport, peer_id, request_id, message.dst_block_ids,
                                       message.num_skip_blocks, message.layerwise)
            stream = self.engine.submit_prefill(message.token_ids, message.sampling, request_id, sender)
            sender.request = stream.request
            report = await asyncio.wait_for(sender.result, DEFAULT_PREFILL_TIMEOUT_S)
        except InvalidRequestError as exc:
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
        except TransferError as exc:
            channel.reply(message, CallError(message=f"prefill of {request_id}: KV transfer failed: {exc}",
                                             kind="transfer"))
        except Exception as exc:
            channel.reply(message, CallError(message=f"prefill of {request_id} failed: {exc}"))
        else:
            channel.reply(message, Prefilled(
                first_token=report.first_token, num_cached_tokens=stream.request.num_cached_tokens,
                num_bytes=report.num_bytes, compute_s=report.compute_s, transfer_s=report.transfer_s,
                exposed_s=report.exposed_s, compute_end_at=report.compute_end_at,
                first_write_at=report.first_write_at))
        finally:  # whatever happened, nothing keeps computing for it (a no-op once it finished)
            self.engine.abort(request_id)
            self.untrack(channel, request_id)
            self._prefills_to.get(message.decode_instance, set()).discard(request_id)

    async def _peer(self, instance_id: str, description: bytes) -> str:
        """Connect the transport to a decode instance once, however many requests ask at once."""
        if instance_id in self._peer_ids:
            return self._peer_ids[instance_id]
        task = self._connecting.get(instance_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self.transport.connect(description))
            self._connecting[instance_id] = task
        try:
            self._peer_ids[instance_id] = await task
        finally:
            self._connecting.pop(instance_id, None)
        return self._peer_ids[instance_id]

    # ---- any role ---------------------------------------------------------------------
    async def _generate(self, channel: Channel, message: Generate) -> None:
        try:
            stream = self.engine.submit(message.token_ids, message.sampling, message.request_id)
        except InvalidRequestError as exc:
            self._send_failure(channel, message.request_id, str(exc))
            return
        await self._forward(channel, stream)

    async def _forward(self, channel: Channel, stream: RequestStream) -> None:
        async with stream:
            async for output in stream:
                channel.send(TokenOutput(request_id=stream.request_id, output=output))
        self.untrack(channel, stream.request_id)

    def _send_failure(self, channel: Channel, request_id: str, reason: str) -> None:
        self.untrack(channel, request_id)
        channel.send(TokenOutput(request_id=request_id, output=RequestOutput.aborted(request_id, reason)))

    async def abort_request(self, request_id: str) -> None:
        self.engine.abort(request_id)
        if not await self._drop_reservation(request_id):
            await self.transport.abort(request_id)

    def stats(self) -> Stats:
        s = self.engine.stats()
        return Stats(instance_id=self.instance_id, role=self.role, num_running=s.num_running,
                     num_waiting=s.num_waiting, num_free_blocks=s.blocks.num_free, num_used_blocks=s.blocks.num_used,
                     num_cached_blocks=s.blocks.num_cached, num_blocks=s.blocks.num_blocks,
                     num_reservations=len(self.reservations), epoch=self.guard.epoch,
                     switching=self.guard.switching)
