"""The prefill role: `Prefill` (compute the prompt, stream its KV into the blocks a decode
instance reserved, renewing the reservation's lease while it progresses) and `Generate`.

It keeps, for the instance's whole life (through role switches, as the transport keeps its
links): the transport peer of each decode instance it connected to, and the prefills under
way by decode instance, so that a lost decode instance (`peer_lost`) aborts every prefill
for it and an abort that comes while a prefill still connects (`abandon`) is told to the
receiver once the connection is up.

The lease: a reservation's lease (decode side, `reservations.py`) must outlive a long prefill
but must not be held forever by one that stopped: so the prefill instance itself sends `Renew`
(through the router, which forwards it to the decode instance) each period in which the request
moved on (`renew_while_progressing`): a chunk computed, a layer write completed, or, still
queued, the engine ran a step (its turn comes). A frozen process sends nothing; a stalled
transfer or a wedged engine shows no progress; either way the lease then runs out on the decode
side and its blocks go back.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Hashable

from minipd.control.channel import Channel
from minipd.control.messages import KV_SIDE_PREFILL, CallError, Generate, Message, Prefill, Prefilled, Renew
from minipd.control.role import Role
from minipd.disagg import instance_spans
from minipd.disagg.layerwise_sender import LayerwiseKVSender
from minipd.disagg.prefill_times import PrefillTimesRecorder
from minipd.disagg.role_handler import RoleHandler, ServingInstance, send_kv_failed
from minipd.engine.engine import Engine
from minipd.engine.request import Request, RequestStatus
from minipd.engine.sampling_params import InvalidRequestError
from minipd.tracing import names
from minipd.transports.base import Transport
from minipd.transports.transfer_error import TransferError

DEFAULT_PREFILL_TIMEOUT_S = 120.0  # from the Prefill to its KV sent
RENEWALS_PER_LEASE = 3  # progress is looked at, and renewed, this often per lease


class PrefillRole(RoleHandler):
    role = Role.PREFILL
    accepts = (Prefill, Generate)

    def __init__(self, instance: ServingInstance):
        super().__init__(instance)
        self._peer_ids: dict[str, str] = {}  # decode instance id -> transport peer id
        self._connecting: dict[str, asyncio.Task] = {}
        self._prefills_to: dict[str, set[str]] = {}  # decode instance id -> ids of prefills for it
        # Prefills under way -> the transport peer their KV goes to (None until connected), and
        # those aborted before that: the receiver must still hear that nothing will come.
        self._prefilling: dict[str, str | None] = {}
        self._abandoned: set[str] = set()

    async def handle(self, channel: Channel, message: Message) -> None:
        if isinstance(message, Prefill):
            await self.prefill(channel, message)
        else:
            await self.generate(channel, message)

    # ---- for the instance's aborts and lost peers ----------------------------------------
    def abandon(self, request_id: str) -> None:
        """An abort of `request_id`: a prefill of it still connecting tells the receiver itself."""
        if request_id in self._prefilling and self._prefilling[request_id] is None:
            self._abandoned.add(request_id)

    def peer_of(self, request_id: str) -> str | None:
        """The transport peer the KV of a prefill under way goes to (None: none, or not yet)."""
        return self._prefilling.get(request_id)

    def peer_lost(self, instance_id: str) -> tuple[str, set[str]]:
        """Forget the decode instance `instance_id`: its transport peer id (the instance id if
        never connected) and the prefills for it, which the caller aborts (no KV can go there)."""
        return self._peer_ids.pop(instance_id, instance_id), self._prefills_to.pop(instance_id, set())

    # ---- Prefill -------------------------------------------------------------------------
    async def prefill(self, channel: Channel, message: Prefill) -> None:
        """Answer `Prefilled` once every byte of the KV is sent; `KVFailed` in its place when the
        KV did not move; or a CallError: "invalid" (an incompatible decode instance, a bad
        prompt), "error"."""
        self.instance.track(channel, message.request_id)
        with self.instance.guard.work.holding(message.request_id):
            await self._prefill(channel, message)

    async def _prefill(self, channel: Channel, message: Prefill) -> None:
        instance, engine, transport = self.instance, self.instance.engine, self.instance.transport
        times = PrefillTimesRecorder(engine.model_config.num_layers) if message.timeline else None
        request_id = message.request_id
        if message.decode_fingerprint != instance.fingerprint:  # a struct's equality: every field the same
            differences = instance.fingerprint.differences(message.decode_fingerprint)
            channel.reply(
                message,
                CallError(
                    message=f"{message.decode_instance} is incompatible with "
                    f"{instance.instance_id}: {'; '.join(differences)}",
                    kind="invalid",
                ),
            )
            instance.untrack(channel, request_id)
            return
        renewals = None
        span = instance_spans.start(names.PREFILL, message, instance.instance_id, instance.role)
        failure: str | None = "ended before it finished"  # what the span ends with
        self._prefilling[request_id] = None
        self._prefills_to.setdefault(message.decode_instance, set()).add(request_id)
        try:
            if instance.tier_wire is not None:  # an abort meanwhile marks it abandoned (checked below)
                await instance.tier_wire.prefetch(message.token_ids, span)
            peer_id = self._prefilling[request_id] = await self._peer(
                message.decode_instance, message.decode_description
            )
            if request_id in self._abandoned:
                await transport.abort(request_id, peer_id=peer_id)
                raise RuntimeError("aborted")
            sender = LayerwiseKVSender(
                engine,
                transport,
                peer_id,
                request_id,
                message.dst_block_ids,
                message.num_skip_blocks,
                message.layerwise,
                span,
                times,
            )
            stream = engine.submit_prefill(message.token_ids, message.sampling, request_id, sender)
            sender.request = stream.request
            if message.lease_s > 0:
                renewals = asyncio.get_running_loop().create_task(
                    renew_while_progressing(
                        channel,
                        request_id,
                        message.lease_s,
                        prefill_progress(engine, transport, stream.request),
                    )
                )
            report = await asyncio.wait_for(sender.result, DEFAULT_PREFILL_TIMEOUT_S)
        except InvalidRequestError as exc:
            failure = str(exc)
            channel.reply(message, CallError(message=str(exc), kind="invalid"))
        except TransferError as exc:
            failure = f"KV transfer failed: {exc}"
            send_kv_failed(instance, channel, request_id, f"prefill of {request_id}: {failure}", KV_SIDE_PREFILL)
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
            engine.abort(request_id)
            if renewals is not None:
                renewals.cancel()
            self._prefilling.pop(request_id, None)
            self._abandoned.discard(request_id)
            instance.untrack(channel, request_id)
            self._prefills_to.get(message.decode_instance, set()).discard(request_id)

    async def _peer(self, instance_id: str, description: bytes) -> str:
        """Connect the transport to a decode instance once, however many requests ask at once."""
        if instance_id in self._peer_ids:
            return self._peer_ids[instance_id]
        task = self._connecting.get(instance_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self.instance.transport.connect(description))
            self._connecting[instance_id] = task
        try:
            self._peer_ids[instance_id] = await task
        finally:
            self._connecting.pop(instance_id, None)
        return self._peer_ids[instance_id]


# ---- the lease renewal (module docstring) -------------------------------------------------
def prefill_progress(engine: Engine, transport: Transport, request: Request) -> Callable[[], Hashable]:
    """A snapshot of how far the prefill of `request` got; it changes whenever it progresses."""

    def snapshot() -> Hashable:
        queued = request.status is RequestStatus.WAITING
        return (
            request.num_computed_tokens,
            transport.num_writes_done(request.request_id),
            engine.num_steps if queued else 0,
        )

    return snapshot


async def renew_while_progressing(
    channel: Channel, request_id: str, lease_s: float, progress: Callable[[], Hashable]
) -> None:
    """Send `Renew(request_id)` on `channel` once per period in which `progress()` changed.
    Runs until cancelled (when the prefill call ends)."""
    last = progress()
    while True:
        await asyncio.sleep(lease_s / RENEWALS_PER_LEASE)  # the renewal period
        now = progress()
        if now != last:
            channel.send(Renew(request_id=request_id))
        last = now
