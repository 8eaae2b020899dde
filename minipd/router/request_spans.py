"""The router's spans of one request (minipd/tracing/names.py): the request, each try, a recompute.

Called by the tracing subscriber of the router's request events (request_subscribers.RequestTracer),
only for a traced request (`routed.span` set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minipd.engine.request import RequestOutput
from minipd.policy.local_prefill import Placement
from minipd.tracing import names
from minipd.tracing.outputs import end_with_output
from minipd.tracing.spans import Span, start_span

if TYPE_CHECKING:
    from minipd.router.registry import InstanceHandle
    from minipd.router.routed_request import RoutedRequest


def start_request(routed: RoutedRequest, traceparent: str | None) -> Span | None:
    """The request's span, under the client's `traceparent` (None, or invalid: a new trace)."""
    return start_span(
        names.REQUEST,
        traceparent,
        {
            "minipd.request_id": routed.request_id,
            "minipd.prompt_tokens": len(routed.token_ids),
            "minipd.max_tokens": routed.params.max_tokens,
        },
        server=True,
    )


def start_try(request_span: Span, number: int) -> Span:
    """Try `number` (1 for the first) of the request; its id on the instances is set by the try."""
    return request_span.child(names.TRY, {"minipd.try": number})


def placement_decided(
    span: Span,
    routed: RoutedRequest,
    decode: InstanceHandle,
    prefill: InstanceHandle | None,
    placement: Placement,
    uncached_on_decode: int,
    num_prefill_candidates: int,
) -> None:
    """The pick and the placement decision, named as `minipd_disagg_decisions_total` names it,
    with the figures it was decided on."""
    remote = prefill is not None and not placement.is_local
    decision = (placement if prefill is not None else Placement.LOCAL_NO_PREFILL).decision
    attributes = {
        "minipd.try_id": routed.wire_id,
        "minipd.decode_instance": decode.instance_id,
        "minipd.disagg.decision": decision,
        "minipd.placement.uncached_tokens": uncached_on_decode,
        "minipd.placement.prefill_candidates": num_prefill_candidates,
        "minipd.placement.decode_inflight": decode.num_inflight,
    }
    if remote:
        attributes["minipd.prefill_instance"] = prefill.instance_id
        attributes["minipd.placement.prefill_inflight_tokens"] = prefill.num_inflight_tokens
    span.set(attributes)
    span.event(names.PICKED, {"minipd.decode_instance": decode.instance_id})


def end_request(span: Span | None, last: RequestOutput, error: str | None = None) -> None:
    """The request ended with its `last` output (failed with `error`; None: not traced)."""
    if span is not None:
        end_with_output(span, last, error)


def end_try(span: Span | None, output: RequestOutput) -> None:
    """A try that ended the request with its final output (None: not traced)."""
    if span is not None:
        end_with_output(span, output)


def end_failed_try(span: Span, stale: bool, retried: bool, blamed: str | None, error: str) -> None:
    """A try that failed: whether it was refused for a stale role epoch, whether the request
    is tried again, the instance blamed (left out of the next try)."""
    span.set({"minipd.try.stale": stale, "minipd.try.retried": retried})
    if blamed is not None:
        span.set({"minipd.try.blamed": blamed})
    span.end(error)
