"""What observes the router's requests, as subscribers of its event seam (request_events.py),
besides the timelines' log (request_log.py, on while `Router.timelines` is set):

- `RequestTracer`: the request's spans, each try's and a recompute's (request_spans.py), and
  the try's trace context, which the try's messages carry to the instances as their parent;
  on once tracing is (`tracing.exporter.tracer()`), for the requests that start while it is;
- `LatencyRelay`: first tokens and token gaps for a `LatencyObserver` (the live ratio
  controller); on while `Router.latency_observer` is set.

Their state of a request lives on it (`routed.span`, `attempt.span`), set
by them only; a request that started before one was subscribed has none, and is skipped.
"""

from __future__ import annotations

from minipd.router import request_spans
from minipd.router.latency_observer import LatencyObserver
from minipd.router.outcome import Outcome
from minipd.router.request_events import (
    DecodeBusy,
    FirstToken,
    Recompute,
    RequestEnded,
    RequestStarted,
    Routed,
    TokensRelayed,
    TryEnded,
    TryStarted,
)
from minipd.tracing import names
from minipd.tracing.exporter import tracer


class RequestTracer:
    def on_request_started(self, event: RequestStarted) -> None:
        if tracer() is not None:
            event.routed.span = request_spans.start_request(event.routed, event.traceparent)

    def on_try_started(self, event: TryStarted) -> None:
        attempt = event.attempt
        if attempt.routed.span is not None:
            attempt.span = request_spans.start_try(attempt.routed.span, attempt.number)
            attempt.traceparent = attempt.span.traceparent

    def on_routed(self, event: Routed) -> None:
        if event.attempt.span is not None:
            request_spans.placement_decided(
                event.attempt.span,
                event.attempt.routed,
                event.decode,
                event.prefill,
                event.placement,
                event.uncached_on_decode,
                len(event.prefill_candidates),
            )

    def on_decode_busy(self, event: DecodeBusy) -> None:
        if event.attempt.span is not None:
            event.attempt.span.event(names.DECODE_BUSY, {"minipd.wait_s": event.wait_s})

    def on_recompute(self, event: Recompute) -> None:
        attempt = event.attempt
        if attempt.span is not None:
            attempt.recompute_span = attempt.span.child(
                names.RECOMPUTE, {"minipd.try_id": attempt.routed.wire_id, "minipd.recompute.reason": event.reason}
            )
            attempt.traceparent = attempt.recompute_span.traceparent

    def on_first_token(self, event: FirstToken) -> None:
        if event.attempt.routed.span is not None:
            event.attempt.routed.span.event(names.FIRST_TOKEN)

    def on_try_ended(self, event: TryEnded) -> None:
        attempt = event.attempt
        span, outcome = attempt.span, attempt.outcome
        if span is None:
            return
        if attempt.recompute_span is not None:
            attempt.recompute_span.end(attempt.reason)
        if outcome is Outcome.FINISHED:
            request_spans.end_try(span, attempt.output)
        elif outcome in (Outcome.ABORTED, Outcome.INTERNAL) or attempt.routed.span.ended:
            span.end("aborted")  # the request ended first (aborted meanwhile)
        else:
            stale = outcome is Outcome.STALE
            request_spans.end_failed_try(span, stale, attempt.retried, attempt.blamed, attempt.reason or "")

    def on_request_ended(self, event: RequestEnded) -> None:
        error = None if event.outcome is Outcome.FINISHED else event.reason or "aborted"
        request_spans.end_request(event.routed.span, event.output, error)


class LatencyRelay:
    def __init__(self, observer: LatencyObserver):
        self.observer = observer

    def on_first_token(self, event: FirstToken) -> None:
        routed, now = event.attempt.routed, event.at
        self.observer.first_token(routed.request_id, now, now - routed.arrival_s, routed.decode_wait_so_far(now))

    def on_tokens_relayed(self, event: TokensRelayed) -> None:
        routed, now = event.attempt.routed, event.at
        self.observer.tokens(now, event.gap_s, event.count, (now - routed.first_token_s) / routed.num_later_tokens)
