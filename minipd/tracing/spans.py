"""The span operations minipd uses, over the OpenTelemetry API.

`start_span` returns None while tracing is off (exporter.py), and every caller keeps that
None and tests it (`if span is not None`) before doing anything else: tracing off costs that
branch. A `Span` carries its context to other processes as a `traceparent` (traceparent.py),
which is how one request's spans on the router and the instances form one trace. A span
whose trace the caller did not sample (its traceparent's flags) records nothing, but still
passes its context on, so the instances honour the caller's choice too.

Times are `time.time()` seconds (floats) where a caller gives one: the wall clock is the one
instances share with the router (the same host, or NTP).
"""

from __future__ import annotations

from typing import Any, Mapping

from minipd.tracing import exporter
from minipd.tracing.traceparent import TraceParent, parse_traceparent

Attributes = Mapping[str, str | bool | int | float]


def _ns(at_s: float | None) -> int | None:
    return None if at_s is None else int(at_s * 1e9)


class Span:
    """One span under way; `end` ends it once (later calls are ignored)."""

    __slots__ = ("_span", "ended")

    def __init__(self, span: Any):
        self._span = span
        self.ended = False

    @property
    def traceparent(self) -> str:
        """This span's context as a version-00 traceparent: the parent of spans elsewhere."""
        context = self._span.get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

    @property
    def trace_id(self) -> str:
        return f"{self._span.get_span_context().trace_id:032x}"

    def child(self, name: str, attributes: Attributes | None = None, start_s: float | None = None) -> "Span":
        from opentelemetry import trace

        tracer = exporter.tracer()
        if tracer is None:  # shut down meanwhile (the process exits): a child that records nothing
            return Span(trace.NonRecordingSpan(self._span.get_span_context()))
        context = trace.set_span_in_context(self._span)
        return Span(tracer.start_span(name, context, attributes=attributes, start_time=_ns(start_s)))

    def event(self, name: str, attributes: Attributes | None = None, at_s: float | None = None) -> None:
        self._span.add_event(name, attributes, _ns(at_s))

    def set(self, attributes: Attributes) -> None:
        self._span.set_attributes(attributes)

    def end(self, error: str | None = None, at_s: float | None = None) -> None:
        """End the span, as failed when `error` says why; a no-op once ended."""
        if self.ended:
            return
        self.ended = True
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_attribute("minipd.error", error)
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end(_ns(at_s))


def start_span(
    name: str,
    parent: str | TraceParent | None,
    attributes: Attributes | None = None,
    *,
    server: bool = False,
    start_s: float | None = None,
) -> Span | None:
    """A span under `parent` (a traceparent, from a client or another minipd process; an
    invalid one is ignored and a trace of its own begun), or None while tracing is off.
    `server`: the span of a request received from outside (SpanKind.SERVER)."""
    tracer = exporter.tracer()
    if tracer is None:
        return None
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    if isinstance(parent, str):
        parent = parse_traceparent(parent)
    context = otel_context.Context()  # never the ambient one: minipd does not use the implicit context
    if parent is not None:
        remote = trace.SpanContext(
            int(parent.trace_id, 16),
            int(parent.span_id, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(parent.flags & 0xFF),
        )
        context = trace.set_span_in_context(trace.NonRecordingSpan(remote), context)
    kind = trace.SpanKind.SERVER if server else trace.SpanKind.INTERNAL
    return Span(tracer.start_span(name, context, kind, attributes, start_time=_ns(start_s)))
