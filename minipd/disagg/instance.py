"""One serving instance: an engine, its KV transport, and a control-plane server.

Roles: `prefill` answers `Prefill` (compute the prompt, stream the KV to a decode instance,
renewing the reservation's lease while it progresses); `decode` answers `Reserve` and
`Decode` (hold blocks, receive the KV, decode); every role answers `Generate` (prefill and
decode here, used for colocated serving and for short prompts), `Abort`, `PeerLost`,
`GetStats`, `SwitchRole` (an in-place role switch; new work carries the role epoch it was
meant for, see role_switch.py) and `SetLinkCap` (the transport's egress cap, at runtime).

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

Length: one class answers every role's calls, and the roles share its transport, reservations
and connections; splitting it by role is due once those are settled.
"""

from __future__ import annotations

import asyncio
import logging
import time

from minipd.control.channel import DEFAULT_LIVENESS_TIMEOUT_S, Channel
from minipd.control.limits import DEFAULT_MAX_CONNECTIONS, max_frame_bytes
from minipd.control.messages import (
    FAILURE_KV_LOAD,
    FAILURE_SHUTDOWN,
    Abort,
    CallError,
    Decode,
    Draining,
    Evict,
    Generate,
    GetStats,
    Hello,
    KVLanded,
    Message,
    PeerLost,
    Prefill,
    Prefilled,
    Renew,
    Reserve,
    Reserved,
    SetLinkCap,
    Stats,
    SwitchRole,
    TokenOutput,
    Welcome,
)
from minipd.control.role import Role
from minipd.control.server import ControlServer
from minipd.disagg import instance_spans
from minipd.disagg.fingerprint import engine_fingerprint
from minipd.disagg.layerwise_sender import LayerwiseKVSender
from minipd.disagg.lease_renewal import prefill_progress, renew_while_progressing
from minipd.disagg.link_cap import set_link_cap
from minipd.disagg.prefill_times import PrefillTimesRecorder
from minipd.disagg.reservations import Reservation, Reservations
from minipd.disagg.role_switch import RoleGuard
from minipd.engine import cpu_placement
from minipd.engine.checked_prompt import CheckedPrompt
from minipd.engine.engine import Engine, NoCapacity
from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError
from minipd.tracing import names
from minipd.tracing.outputs import end_with_output
from minipd.tracing.spans import Span
from minipd.transports import fault_points
from minipd.transports.backends import create_transport
from minipd.transports.base import Transport
from minipd.transports.shared_secret import SharedSecret
from minipd.transports.transfer_error import TransferError

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 30.0
DEFAULT_LAND_TIMEOUT_S = 30.0
DEFAULT_PREFILL_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 10.0


class Instance(ControlServer):
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
    ):
        super().__init__(instance_id, secret, max_connections)
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
        self.reservations = Reservations(engine, transport, lease_s, instance_id, self._lease_expired)
        self.num_refused_reservations = 0  # for lack of free blocks: this pool is the authority on its room
        self._peer_ids: dict[str, str] = {}  # decode instance id -> transport peer id
        self._connecting: dict[str, asyncio.Task] = {}
        self._prefills_to: dict[str, set[str]] = {}  # decode instance id -> ids of prefills for it
        self._routers: set[Channel] = set()  # connections of routers
        self.unrouted = asyncio.Event()  # set while no router is connected (registration watches it)
        self.unrouted.set()
        # Prefills under way -> the transport peer their KV goes to (None until connected), and
        # those aborted before that: the receiver must still hear that nothing will come.
        self._prefilling: dict[str, str | None] = {}
        self._abandoned: set[str] = set()
        self.expired_leases: asyncio.Queue[str] = asyncio.Queue()  # request ids, for observers and tests

    @property
    def role(self) -> Role:
        return self.guard.role

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
    ) -> "Instance":
        """`secret` also goes to the transport; `max_connections` caps the control port only."""
        transport = create_transport(
            transport_name, engine.kv_pool, instance_id=instance_id, secret=secret, **(transport_options or {})
        )
        await transport.start()
        await engine.start()
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
        )

    async def serve(self, host: str, port: int) -> int:
        """Start the control-plane server; returns the bound port."""
        port = await super().serve(host, port)
        self.reservations.start()
        return port

    async def close(self) -> None:
        await self.close_connections()
        await self.reservations.close()
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

    # ---- dispatch (every peer here is an authenticated router) -------------------------
    async def handle(self, channel: Channel, message: Message) -> None:
        match message:
            case Reserve():
                if self._refuse_while_draining(channel, message) or self.guard.refused(channel, message):
                    return
                self.track(channel, message.request_id)
                span = instance_spans.start(names.RESERVE, message, self.instance_id, self.role)
                self._reserve(channel, message, span)
                if span is not None:  # refused (the span of a reservation ended before its reply)
                    instance_spans.end_reserve(span, None)
            case Prefill():
                if self._refuse_while_draining(channel, message) or self.guard.refused(channel, message):
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
                if not self.accepting:
                    self._send_failure(
                        channel, message.request_id, f"{self.instance_id} is shutting down", FAILURE_SHUTDOWN
                    )
                    return
                if self.guard.refused(channel, message):
                    return
                self.track(channel, message.request_id)
                with self.guard.work.holding(message.request_id):
                    await self._generate(channel, message)
            case SwitchRole():
                await self.guard.handle_switch(channel, message, self._reset_pool)
            case SetLinkCap():
                channel.reply(message, set_link_cap(self.transport, message.gbps))
            case Renew():
                self.reservations.renew(message.request_id)
            case Abort():
                await self.abort_request(message.request_id)
                self.untrack(channel, message.request_id)
            case PeerLost():
                self.transport.peer_lost(
                    self._peer_ids.pop(message.instance_id, message.instance_id), message.reason, message.fenced
                )
                for request_id in self._prefills_to.pop(message.instance_id, set()):  # no KV can go there
                    await self.abort_request(request_id)
            case Evict():
                await self.end_channel(channel, f"evicted by the router: {message.reason}")
            case GetStats():
                if message.settle:
                    await self.engine.wait_idle(SETTLE_TIMEOUT_S)
                    await self.reservations.wait_fenced(SETTLE_TIMEOUT_S)
                channel.reply(message, self.stats())
            case _:
                log.warning("%s: unexpected %s", self.instance_id, type(message).__name__)

    async def _reset_pool(self) -> None:
        """Once drained: let the engine settle (aborts applied, fenced blocks back), then
        forget the prefix cache."""
        if not await self.engine.wait_idle(SETTLE_TIMEOUT_S):
            raise RuntimeError("the engine did not go idle")
        if not await self.reservations.wait_fenced(SETTLE_TIMEOUT_S):
            raise RuntimeError("blocks of aborted transfers are still fenced")
        self.engine.reset_pool()

    def _refuse(self, serves: bool, what: str, channel: Channel, message) -> bool:
        """Answer a call this instance's role does not serve with an error; True if refused."""
        if serves:
            return False
        channel.reply(
            message,
            CallError(
                message=f"{self.instance_id} is a {self.role.value} instance; it does not serve {what}", kind="invalid"
            ),
        )
        return True

    def _refuse_while_draining(self, channel: Channel, message) -> bool:
        if self.accepting:
            return False
        channel.reply(message, CallError(message=f"{self.instance_id} is shutting down", kind=FAILURE_SHUTDOWN))
        return True

    # ---- decode role ------------------------------------------------------------------
    def _reserve(self, channel: Channel, message: Reserve, span: Span | None = None) -> None:
        if self._refuse(self.role.serves_decode, "decode", channel, message):
            return
        request_id = message.request_id
        try:
            if request_id in self.reservations.held:
                raise InvalidRequestError("request_id", f"{request_id!r} already holds a reservation")
            block_ids, num_cached = self.engine.reserve(message.token_ids)
        except NoCapacity as exc:
            self.num_refused_reservations += 1
            channel.reply(message, CallError(message=str(exc), kind="busy"))
            return
        except InvalidRequestError as exc:
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
            return
        dst = block_ids[num_cached // self.engine.config.block_size :]
        try:
            self.transport.expect(request_id, message.prefill_instance, dst)
        except ValueError as exc:
            self.engine.release_blocks(block_ids)
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
            return
        self.reservations.add(request_id, message.token_ids, block_ids, num_cached, channel)
        self.guard.work.hold(request_id)  # until its decode stream ends or the reservation is dropped
        if span is not None:  # before the reply: the router's Prefill follows it
            instance_spans.end_reserve(span, self.reservations.held[request_id])
        channel.reply(message, Reserved(num_cached_tokens=num_cached, dst_block_ids=dst, lease_s=self.lease_s))
        fault_points.hit("decode.reserved", request_id)

    async def _decode(self, channel: Channel, message: Decode) -> None:
        request_id = message.request_id
        span = instance_spans.start(names.DECODE, message, self.instance_id, self.role)
        reservation = self.reservations.take(request_id)
        if reservation is None:
            self._send_failure(
                channel,
                request_id,
                f"{self.instance_id} holds no reservation for it (its lease expired or it was aborted)",
                FAILURE_KV_LOAD,
                span,
            )
            return
        received_at = time.time()  # a wall clock, as the transport's landed_at
        ordered_after_s = time.monotonic() - reservation.reserved_at
        try:
            landed = await self.transport.wait_landed(request_id, DEFAULT_LAND_TIMEOUT_S)
        except TransferError as exc:
            await self.reservations.release(request_id, reservation.block_ids)  # once no late byte can land
            channel.send(KVLanded(request_id=request_id, error=str(exc)))
            self._send_failure(channel, request_id, f"the KV did not load: {exc}", FAILURE_KV_LOAD, span)
            return
        if span is not None:
            span.event(names.KV_LANDED, {"minipd.kv.bytes": landed.num_bytes}, at_s=landed.landed_at)
        try:
            stream = self.engine.adopt(
                reservation.token_ids,
                reservation.block_ids,
                reservation.num_cached_tokens,
                message.first_token,
                message.sampling,
                request_id,
            )
        except InvalidRequestError as exc:
            channel.send(KVLanded(request_id=request_id, landed_at=landed.landed_at))
            self.engine.release_blocks(reservation.block_ids)
            self._send_failure(channel, request_id, f"{type(exc).__name__}: {exc}", span=span)
            return
        # sent before the first token, so the router has the figures when the request finishes
        now = time.time()
        adopt_s = max(0.0, now - max(received_at, landed.landed_at))
        # the landing on this process's monotonic clock: its wall-clock stamp less the wall clock's lead now
        landed_after_s = landed.landed_at - now + time.monotonic() - reservation.reserved_at
        channel.send(
            KVLanded(
                request_id=request_id,
                landed_at=landed.landed_at,
                adopt_s=adopt_s,
                landed_after_s=landed_after_s,
                ordered_after_s=ordered_after_s,
            )
        )
        await self._forward(channel, stream, span)

    def _lease_expired(self, request_id: str, reservation: Reservation) -> None:
        self.guard.work.release(request_id)
        self.untrack(reservation.channel, request_id)
        reservation.channel.send(
            KVLanded(
                request_id=request_id,
                error=(f"the reservation on {self.instance_id} expired: no prefill progress for {self.lease_s} s"),
            )
        )
        self.expired_leases.put_nowait(request_id)

    # ---- prefill role -----------------------------------------------------------------
    async def _prefill(self, channel: Channel, message: Prefill) -> None:
        times = PrefillTimesRecorder(self.engine.model_config.num_layers) if message.timeline else None
        if self._refuse(self.role.serves_prefill, "prefill", channel, message):
            return
        request_id = message.request_id
        differences = self.fingerprint.differences(message.decode_fingerprint)
        if differences:
            channel.reply(
                message,
                CallError(
                    message=f"{message.decode_instance} is incompatible with "
                    f"{self.instance_id}: {'; '.join(differences)}",
                    kind="invalid",
                ),
            )
            self.untrack(channel, request_id)
            return
        renewals = None
        span = instance_spans.start(names.PREFILL, message, self.instance_id, self.role)
        failure: str | None = "ended before it finished"  # what the span ends with
        self._prefilling[request_id] = None
        self._prefills_to.setdefault(message.decode_instance, set()).add(request_id)
        try:
            peer_id = self._prefilling[request_id] = await self._peer(
                message.decode_instance, message.decode_description
            )
            if request_id in self._abandoned:
                await self.transport.abort(request_id, peer_id=peer_id)
                raise RuntimeError("aborted")
            sender = LayerwiseKVSender(
                self.engine,
                self.transport,
                peer_id,
                request_id,
                message.dst_block_ids,
                message.num_skip_blocks,
                message.layerwise,
                span,
                times,
            )
            stream = self.engine.submit_prefill(message.token_ids, message.sampling, request_id, sender)
            sender.request = stream.request
            if message.lease_s > 0:
                renewals = asyncio.get_running_loop().create_task(
                    renew_while_progressing(
                        channel,
                        request_id,
                        message.lease_s,
                        prefill_progress(self.engine, self.transport, stream.request),
                    )
                )
            report = await asyncio.wait_for(sender.result, DEFAULT_PREFILL_TIMEOUT_S)
        except InvalidRequestError as exc:
            failure = str(exc)
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
        except TransferError as exc:
            failure = f"KV transfer failed: {exc}"
            channel.reply(
                message, CallError(message=f"prefill of {request_id}: KV transfer failed: {exc}", kind="transfer")
            )
        except Exception as exc:
            failure = f"failed: {exc}"
            channel.reply(message, CallError(message=f"prefill of {request_id} failed: {exc}"))
        else:
            failure = None
            if span is not None:
                span.set(
                    {
                        "minipd.cached_tokens": stream.request.num_cached_tokens,
                        "minipd.compute_s": report.compute_s,
                        "minipd.first_token": report.first_token,
                    }
                )
                span.end()  # before the reply: the router's Decode follows it
            channel.reply(
                message,
                Prefilled(
                    first_token=report.first_token,
                    num_cached_tokens=stream.request.num_cached_tokens,
                    num_bytes=report.num_bytes,
                    compute_s=report.compute_s,
                    transfer_s=report.transfer_s,
                    exposed_s=report.exposed_s,
                    compute_end_at=report.compute_end_at,
                    first_write_at=report.first_write_at,
                    times=None if times is None else times.times(),
                ),
            )
        finally:  # whatever happened, nothing keeps computing for it (a no-op once it finished)
            if span is not None:
                span.end(failure)
            self.engine.abort(request_id)
            if renewals is not None:
                renewals.cancel()
            self._prefilling.pop(request_id, None)
            self._abandoned.discard(request_id)
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
        span = instance_spans.start(names.GENERATE, message, self.instance_id, self.role)
        try:
            # the router validated the prompt: the engine checks its invariants only
            stream = self.engine.submit(CheckedPrompt(message.token_ids, message.sampling), None, message.request_id)
        except InvalidRequestError as exc:
            self._send_failure(channel, message.request_id, str(exc), span=span)
            return
        await self._forward(channel, stream, span)

    async def _forward(self, channel: Channel, stream: RequestStream, span: Span | None = None) -> None:
        """Relay the stream's outputs to the router; `span` (traced) ends with the last one."""
        num_sent = 0
        try:
            async with stream:
                async for output in stream:
                    if output.finish_reason == "abort" and output.error is None and not self.accepting:
                        output.error = f"{self.instance_id} shut down before the request finished"
                    if span is not None:  # ended before the last output goes: the router's try ends after it
                        if num_sent == 0:
                            span.event(names.FIRST_TOKEN)
                        if output.finished:
                            end_with_output(span, output, "aborted" if output.finish_reason == "abort" else None)
                    channel.send(TokenOutput(request_id=stream.request_id, output=output))
                    num_sent += 1
                    if num_sent == 2:
                        fault_points.hit("decode.streaming", stream.request_id)
        finally:
            if span is not None:
                span.end("ended before it finished")  # a no-op once ended with its last output
        self.untrack(channel, stream.request_id)

    def _send_failure(
        self, channel: Channel, request_id: str, reason: str, kind: str = "", span: Span | None = None
    ) -> None:
        if span is not None:
            span.end(reason)
        self.untrack(channel, request_id)
        channel.send(
            TokenOutput(request_id=request_id, output=RequestOutput.aborted(request_id, reason), failure_kind=kind)
        )

    async def abort_request(self, request_id: str) -> None:
        self.engine.abort(request_id)
        if request_id in self._prefilling and self._prefilling[request_id] is None:
            self._abandoned.add(request_id)  # still connecting: `_prefill` tells the receiver
        if await self.reservations.drop(request_id):
            self.guard.work.release(request_id)  # the reservation's hold (see _reserve)
        else:
            await self.transport.abort(request_id, peer_id=self._prefilling.get(request_id))

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
        )
