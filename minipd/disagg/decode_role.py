"""The decode role: `Reserve` (hold blocks for a prompt whose KV another instance computes),
`Decode` (once that KV landed: adopt the blocks and stream the tokens), and `Generate`.

A reservation is in-flight work of the role guard from its `Reserve` until its decode stream
ends or the reservation is dropped (aborted, or its lease expired: `lease_expired`), so a role
switch drains it; a `Decode` for a held reservation is served during that drain too.
"""

from __future__ import annotations

import time

from minipd.control.channel import Channel
from minipd.control.messages import (
    KV_SIDE_DECODE,
    CallError,
    Decode,
    Generate,
    KVLanded,
    Message,
    Reserve,
    Reserved,
)
from minipd.control.role import Role
from minipd.disagg import instance_spans
from minipd.disagg.reservations import Reservation
from minipd.disagg.role_handler import RoleHandler, ServingInstance, send_failure, send_kv_failed
from minipd.engine.engine import NoCapacity
from minipd.engine.sampling_params import InvalidRequestError
from minipd.tracing import names
from minipd.tracing.spans import Span
from minipd.transports import fault_points
from minipd.transports.transfer_error import TransferError

DEFAULT_LAND_TIMEOUT_S = 30.0  # a Decode waits this long for the rest of its KV to land


class DecodeRole(RoleHandler):
    role = Role.DECODE
    accepts = (Reserve, Decode, Generate)

    def __init__(self, instance: ServingInstance):
        super().__init__(instance)
        self.num_refused_reservations = 0  # for lack of free blocks: this pool is the authority on its room

    async def handle(self, channel: Channel, message: Message) -> None:
        if isinstance(message, Reserve):
            self.reserve(channel, message)
        elif isinstance(message, Decode):
            await self.decode(channel, message)
        else:
            await self.generate(channel, message)

    def reserve(self, channel: Channel, message: Reserve) -> None:
        """Answer `Reserved` (blocks held for the lease), or a CallError: "busy" (no free
        blocks now: the router asks again) or "invalid"."""
        instance = self.instance
        instance.track(channel, message.request_id)
        span = instance_spans.start(names.RESERVE, message, instance.instance_id, instance.role)
        self._reserve(channel, message, span)
        if span is not None:  # refused (the span of a reservation ended before its reply)
            instance_spans.end_reserve(span, None)

    def _reserve(self, channel: Channel, message: Reserve, span: Span | None) -> None:
        instance, engine, reservations = self.instance, self.instance.engine, self.instance.reservations
        request_id = message.request_id
        try:
            if request_id in reservations.held:
                raise InvalidRequestError("request_id", f"{request_id!r} already holds a reservation")
            block_ids, num_cached = engine.reserve(message.token_ids)
        except NoCapacity as exc:
            self.num_refused_reservations += 1
            channel.reply(message, CallError(message=str(exc), kind="busy"))
            return
        except InvalidRequestError as exc:
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
            return
        dst = block_ids[num_cached // engine.config.block_size :]
        try:
            instance.transport.expect(request_id, message.prefill_instance, dst)
        except ValueError as exc:
            engine.release_blocks(block_ids)
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
            return
        reservations.add(request_id, message.token_ids, block_ids, num_cached, channel)
        instance.guard.work.hold(request_id)  # until its decode stream ends or the reservation is dropped
        if span is not None:  # before the reply: the router's Prefill follows it
            instance_spans.end_reserve(span, reservations.held[request_id])
        channel.reply(message, Reserved(num_cached_tokens=num_cached, dst_block_ids=dst, lease_s=instance.lease_s))
        fault_points.hit("decode.reserved", request_id)

    async def decode(self, channel: Channel, message: Decode) -> None:
        """Stream the tokens of a held reservation, its `KVLanded` first; or answer `KVFailed`
        in place of the stream when the reservation is gone or its KV did not land, or fail the
        stream (the sequence could not be adopted)."""
        try:
            await self._decode(channel, message)
        finally:
            self.instance.guard.work.release(message.request_id)  # the reservation's hold (see _reserve)

    async def _decode(self, channel: Channel, message: Decode) -> None:
        instance = self.instance
        request_id = message.request_id
        span = instance_spans.start(names.DECODE, message, instance.instance_id, instance.role)
        reservation = instance.reservations.take(request_id)
        if reservation is None:
            send_kv_failed(
                instance,
                channel,
                request_id,
                f"{instance.instance_id} holds no reservation for it (its lease expired or it was aborted)",
                KV_SIDE_DECODE,
                span,
            )
            return
        received_at = time.time()  # a wall clock, as the transport's landed_at
        ordered_after_s = time.monotonic() - reservation.reserved_at
        try:
            landed = await instance.transport.wait_landed(request_id, DEFAULT_LAND_TIMEOUT_S)
        except TransferError as exc:
            await instance.reservations.release(request_id, reservation.block_ids)  # once no late byte can land
            send_kv_failed(instance, channel, request_id, f"the KV did not load: {exc}", KV_SIDE_DECODE, span)
            return
        if span is not None:
            span.event(names.KV_LANDED, {"minipd.kv.bytes": landed.num_bytes}, at_s=landed.landed_at)
        try:
            stream = instance.engine.adopt(
                reservation.token_ids,
                reservation.block_ids,
                reservation.num_cached_tokens,
                message.first_token,
                message.sampling,
                request_id,
            )
        except InvalidRequestError as exc:
            channel.send(KVLanded(request_id=request_id, landed_at=landed.landed_at))
            instance.engine.release_blocks(reservation.block_ids)
            send_failure(instance, channel, request_id, f"{type(exc).__name__}: {exc}", span=span)
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
        await self.forward(channel, stream, span)

    def lease_expired(self, request_id: str, reservation: Reservation) -> None:
        """The reservations' expiry callback: the lease ran out before its Decode came (no
        prefill progress renewed it); the router hears why (`KVFailed`) on the reservation's connection."""
        instance = self.instance
        instance.guard.work.release(request_id)
        why = f"the reservation on {instance.instance_id} expired: no prefill progress for {instance.lease_s} s"
        send_kv_failed(instance, reservation.channel, request_id, why, KV_SIDE_DECODE)
        instance.expired_leases.put_nowait(request_id)
