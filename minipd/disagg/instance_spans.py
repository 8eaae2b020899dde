"""An instance's spans of the calls it serves (tracing/names.py): reserve, prefill, decode, generate.

A call is traced when its message carries a traceparent (the router's try) and this process
exports traces; `start` returns None otherwise, and the instance tests that before anything
else. Each span names the instance, its role when the call came, and the try's id.
"""

from __future__ import annotations

from minipd.control.messages import Decode, Generate, Prefill, Reserve
from minipd.control.role import Role
from minipd.disagg.reservations import Reservation
from minipd.tracing.spans import Span, start_span


def start(name: str, message: Reserve | Prefill | Decode | Generate, instance_id: str, role: Role) -> Span | None:
    if message.traceparent is None:
        return None
    attributes = {"minipd.instance_id": instance_id, "minipd.role": role.value, "minipd.try_id": message.request_id}
    if not isinstance(message, Decode):
        attributes["minipd.prompt_tokens"] = len(message.token_ids)
    return start_span(name, message.traceparent, attributes)


def end_reserve(span: Span, reservation: Reservation | None) -> None:
    """A Reserve answered: blocks held (with the prefix the decode instance had), or refused
    (a full pool: the router asks again); a no-op once ended."""
    if span.ended:
        return
    span.set({"minipd.reserved": reservation is not None})
    if reservation is not None:
        span.set({"minipd.cached_tokens": reservation.num_cached_tokens, "minipd.blocks": len(reservation.block_ids)})
    span.end()
