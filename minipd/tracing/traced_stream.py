"""A colocated engine's request as one span (`minipd.request`), ended with its output stream.

The HTTP front of `minipd --role both --port P` serves from the engine directly (no router,
no control plane): its request span wraps the engine's stream and ends with the last output
(finish reason, counts, error), or as aborted when the client leaves first.
"""

from __future__ import annotations

from typing import AsyncIterator

from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.tracing import names
from minipd.tracing.outputs import end_with_output
from minipd.tracing.spans import Span, start_span


def traced_stream(
    stream: RequestStream, traceparent: str | None, instance_name: str, num_prompt_tokens: int
) -> "TracedStream | RequestStream":
    """`stream` under a span of its own (a child of the client's `traceparent`), or as it is
    when the span cannot start (tracing shut down meanwhile)."""
    span = start_span(
        names.REQUEST,
        traceparent,
        {
            "minipd.request_id": stream.request_id,
            "minipd.instance_id": instance_name,
            "minipd.role": "both",
            "minipd.prompt_tokens": num_prompt_tokens,
        },
        server=True,
    )
    return stream if span is None else TracedStream(stream, span)


class TracedStream:
    """An `OutputStream` (api/backend.py) that ends `span` with its last output."""

    def __init__(self, stream: RequestStream, span: Span):
        self._stream, self.span = stream, span
        self.request_id = stream.request_id
        self._first = True

    def abort(self) -> None:
        self._stream.abort()

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        async for output in self._stream:
            if output.token_ids and self._first:
                self._first = False
                self.span.event(names.FIRST_TOKEN)
            if output.finished:
                end_with_output(self.span, output, "aborted" if output.finish_reason == "abort" else None)
            yield output

    async def __aenter__(self) -> "TracedStream":
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self._stream.__aexit__(*exc)
        finally:
            self.span.end("aborted: the client left before the request finished")  # a no-op once ended
