"""The request event seam: the router publishes each step of a request's life here, once,
where it happens, and whatever observes requests subscribes here (docs/architecture.md, "The
request event seam", lists the events, where each is published, and the subscribers).

An event is a small typed object naming the try (`attempt`, its `try_state.TryState`) or the
request (`routed`) it is about, with what the router learnt at that point; it is built only
when some subscriber handles its kind, and handed to each of them in the order they
subscribed. A subscriber is any object with a method `on_<event>` (`on_first_token`,
`on_try_ended`, ...) for each kind it handles; kinds it has no method for are never built for
it. So a request with no subscriber costs one dictionary look-up per step, and the request
path holds no test of who is listening. The dispatch (`RequestEvents`) is event_seam.py's.

Subscribers are called synchronously: the event's stamp (`at`, `time.monotonic()`) is the
moment it happened, and the figures it points to (an instance's load, the try's state) are
those of that moment; a subscriber must not block, and what it raises reaches the request path.

Most stamps are taken when the event is built (`at` defaults to now), so a step no one listens
to reads no clock for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from minipd.router.event_seam import RequestEvents as RequestEvents  # the seam's dispatch

if TYPE_CHECKING:
    from minipd.control.messages import KVLanded, Prefilled, Reserved
    from minipd.engine.request import RequestOutput
    from minipd.policy.local_prefill import Placement
    from minipd.router.outcome import Outcome
    from minipd.router.registry import InstanceHandle
    from minipd.router.routed_request import RoutedRequest
    from minipd.router.try_state import TryState


class RequestEvent:
    __slots__ = ()
    handler: ClassVar[str]  # the subscriber's method for it


@dataclass(slots=True)
class RequestStarted(RequestEvent):
    """Accepted and about to be routed; `traceparent` is the caller's W3C trace context (or None)."""

    handler: ClassVar[str] = "on_request_started"
    routed: RoutedRequest
    traceparent: str | None


@dataclass(slots=True)
class TryStarted(RequestEvent):
    """A try begins (`attempt.number`, 1 for the first); a subscriber may set what the try's
    messages carry for it: `attempt.traceparent`, `attempt.prefill_times_wanted`."""

    handler: ClassVar[str] = "on_try_started"
    attempt: TryState
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class Routed(RequestEvent):
    """The try's instances and placement are decided (`prefill` None: none to pick; a local
    placement prefills on `decode`); `prefill_candidates`: the prefill instances it could pick."""

    handler: ClassVar[str] = "on_routed"
    attempt: TryState
    decode: InstanceHandle
    prefill: InstanceHandle | None
    placement: Placement
    uncached_on_decode: int
    prefill_candidates: list[InstanceHandle]


@dataclass(slots=True)
class ReserveSent(RequestEvent):
    """The try's first Reserve is sent to its decode instance."""

    handler: ClassVar[str] = "on_reserve_sent"
    attempt: TryState
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class DecodeBusy(RequestEvent):
    """The decode instance had no room for the prompt's KV: the Reserve is sent again after `wait_s`."""

    handler: ClassVar[str] = "on_decode_busy"
    attempt: TryState
    wait_s: float


@dataclass(slots=True)
class KVReserved(RequestEvent):
    """The decode instance reserved the blocks: the Reserve answered was sent at `sent`."""

    handler: ClassVar[str] = "on_kv_reserved"
    attempt: TryState
    reserved: Reserved
    sent: float
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class PrefillStarted(RequestEvent):
    """The Prefill is sent to the try's prefill instance."""

    handler: ClassVar[str] = "on_prefill_started"
    attempt: TryState
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class PrefillFinished(RequestEvent):
    """The prefill instance answered with the first token (and, asked for them, its times)."""

    handler: ClassVar[str] = "on_prefill_finished"
    attempt: TryState
    prefilled: Prefilled
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class Recompute(RequestEvent):
    """The try's KV did not load (`reason`): its decode instance prefills the prompt itself,
    under a fresh try id (`attempt.routed.wire_id`)."""

    handler: ClassVar[str] = "on_recompute"
    attempt: TryState
    reason: str
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class StreamStarted(RequestEvent):
    """The Decode (or, prefilled on the decode instance, the Generate) is sent: tokens follow."""

    handler: ClassVar[str] = "on_stream_started"
    attempt: TryState
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class KVTransferred(RequestEvent):
    """The decode instance says the try's KV landed (and when, on its clock)."""

    handler: ClassVar[str] = "on_kv_transferred"
    attempt: TryState
    landed: KVLanded


@dataclass(slots=True)
class FirstToken(RequestEvent):
    """The request's first token is about to reach the caller (`at`, as `routed.first_token_s`)."""

    handler: ClassVar[str] = "on_first_token"
    attempt: TryState
    at: float


@dataclass(slots=True)
class TokensRelayed(RequestEvent):
    """`count` later tokens are about to reach the caller, `gap_s` after its previous ones."""

    handler: ClassVar[str] = "on_tokens_relayed"
    attempt: TryState
    at: float
    count: int
    gap_s: float


@dataclass(slots=True)
class TryEnded(RequestEvent):
    """The try ended: `attempt.outcome`, `.reason`, `.blamed`, `.retried`, `.output` say how."""

    handler: ClassVar[str] = "on_try_ended"
    attempt: TryState
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class RequestEnded(RequestEvent):
    """The request ended with `output` (its final output, handed to the caller next); `reason`:
    why it failed (None: finished, or aborted by its caller)."""

    handler: ClassVar[str] = "on_request_ended"
    routed: RoutedRequest
    outcome: Outcome
    reason: str | None
    output: RequestOutput
    at: float = field(default_factory=time.monotonic)


EVENTS: tuple[type[RequestEvent], ...] = (
    RequestStarted,
    TryStarted,
    Routed,
    ReserveSent,
    DecodeBusy,
    KVReserved,
    PrefillStarted,
    PrefillFinished,
    Recompute,
    StreamStarted,
    KVTransferred,
    FirstToken,
    TokensRelayed,
    TryEnded,
    RequestEnded,
)
