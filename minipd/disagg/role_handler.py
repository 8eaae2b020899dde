"""What an instance's role handler is, and the serving all roles share: a `Generate`'s stream.

The instance (instance.py) keeps one handler per role for its whole life and routes each work
message (`ROLE_MESSAGES`) to the handler of the role it has when the message arrives: a role
switch changes the role (role_switch.py), and with it the handler. It routes only what the
handler `accepts`, after its own admission checks (shutdown, role epoch); anything else it
refuses itself (`Instance.refuse_unaccepted`), so a handler never sees a message it does not
take and holds no refusal of its own.

A handler works on the instance's shared parts (engine, transport, reservations, role guard,
connections), which a switch keeps; what it keeps itself (the prefill role's transport peers,
the decode role's refusal count) lives as long as the instance, through every switch.
"""

from __future__ import annotations

import asyncio
from typing import Literal, Protocol

from minipd.control.channel import Channel
from minipd.control.messages import Decode, Fingerprint, Generate, KVFailed, Message, Prefill, Reserve, TokenOutput
from minipd.control.role import Role
from minipd.disagg import instance_spans
from minipd.disagg.reservations import Reservations
from minipd.disagg.role_switch import RoleGuard
from minipd.disagg.tier_wire import TierWire
from minipd.engine.checked_prompt import CheckedPrompt
from minipd.engine.engine import Engine
from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError
from minipd.tracing import names
from minipd.tracing.outputs import end_with_output
from minipd.tracing.spans import Span
from minipd.transports import fault_points
from minipd.transports.base import Transport

# The messages a role handler serves; the instance answers every other one itself.
ROLE_MESSAGES: tuple[type[Message], ...] = (Reserve, Prefill, Decode, Generate)


class ServingInstance(Protocol):
    """What a handler uses of its instance (instance.py:Instance), all shared by every role."""

    instance_id: str
    engine: Engine
    transport: Transport
    reservations: Reservations
    guard: RoleGuard  # the role, its epoch, and the work in flight a switch drains
    fingerprint: Fingerprint
    tier_wire: TierWire | None  # the shared KV tier: fetched before a prompt is computed
    lease_s: float
    accepting: bool  # False once shutting down
    expired_leases: asyncio.Queue[str]

    @property
    def role(self) -> Role: ...

    def track(self, channel: Channel, request_id: str) -> None: ...

    def untrack(self, channel: Channel, request_id: str) -> None: ...


def send_failure(
    instance: ServingInstance, channel: Channel, request_id: str, reason: str, kind: str = "", span: Span | None = None
) -> None:
    """End a stream request (`Generate`, `Decode`) with a failed output saying why; `kind` is
    its TokenOutput.failure_kind (FAILURE_SHUTDOWN, or ""). A KV that will not land is no
    failed output: see `send_kv_failed`."""
    if span is not None:
        span.end(reason)
    instance.untrack(channel, request_id)
    channel.send(
        TokenOutput(request_id=request_id, output=RequestOutput.aborted(request_id, reason), failure_kind=kind)
    )


def send_kv_failed(
    instance: ServingInstance,
    channel: Channel,
    request_id: str,
    reason: str,
    side: Literal["prefill", "decode"],
    span: Span | None = None,
) -> None:
    """End this instance's part of a request whose KV will not land in its reservation with the
    one report of that (`KVFailed`, what the router's kv_load_failure policy acts on): in place
    of a `Prefill`'s reply, of a `Decode`'s stream, or, for a reservation given up, unasked."""
    if span is not None:
        span.end(reason)
    instance.untrack(channel, request_id)
    channel.send(KVFailed(request_id=request_id, reason=reason, side=side))


class RoleHandler:
    """Serves the work messages of one role. Contract: `handle` is called only with a message
    of `accepts` (a subset of ROLE_MESSAGES) that passed the instance's admission checks, and
    answers it completely (reply, stream or failure); it tracks the request on its channel and
    holds it in the role guard's in-flight work for as long as it works on it."""

    role: Role
    accepts: tuple[type[Message], ...]

    def __init__(self, instance: ServingInstance):
        self.instance = instance

    async def handle(self, channel: Channel, message: Message) -> None:
        raise NotImplementedError

    async def generate(self, channel: Channel, message: Generate) -> None:
        """Prefill and decode here (colocated serving, or a prompt too short to move); every
        role takes it."""
        instance = self.instance
        instance.track(channel, message.request_id)
        with instance.guard.work.holding(message.request_id):
            span = instance_spans.start(names.GENERATE, message, instance.instance_id, instance.role)
            wire = instance.tier_wire
            if wire is not None and not await wire.prefetch_for(message.request_id, message.token_ids, span):
                send_failure(instance, channel, message.request_id, "aborted", span=span)
                return
            try:
                # the router validated the prompt: the engine checks its invariants only
                stream = instance.engine.submit(
                    CheckedPrompt(message.token_ids, message.sampling), None, message.request_id
                )
            except InvalidRequestError as exc:
                send_failure(instance, channel, message.request_id, str(exc), span=span)
                return
            await self.forward(channel, stream, span)

    async def forward(self, channel: Channel, stream: RequestStream, span: Span | None = None) -> None:
        """Relay the stream's outputs to the router; `span` (traced) ends with the last one."""
        instance = self.instance
        num_sent = 0
        try:
            async with stream:
                async for output in stream:
                    if output.finish_reason == "abort" and output.error is None and not instance.accepting:
                        output.error = f"{instance.instance_id} shut down before the request finished"
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
        instance.untrack(channel, stream.request_id)
