"""Ending a span with a request's final output: why it finished, its counts, its error."""

from __future__ import annotations

from minipd.engine.request import RequestOutput
from minipd.tracing.spans import Span


def end_with_output(span: Span, output: RequestOutput | None, error: str | None = None) -> None:
    """End `span` with the final `output` (None: it never came, `error` says why); a no-op
    once it ended."""
    if span.ended:
        return
    if output is not None:
        span.set(
            {
                "minipd.finish_reason": output.finish_reason or "",
                "minipd.prompt_tokens": output.num_prompt_tokens,
                "minipd.output_tokens": output.num_output_tokens,
                "minipd.cached_tokens": output.num_cached_tokens,
            }
        )
        if output.transfer is not None:  # as the router measured it: the receiver's landing time
            span.set(
                {
                    "minipd.kv.bytes": output.transfer.num_bytes,
                    "minipd.kv.transfer_s": output.transfer.transfer_s,
                    "minipd.kv.exposed_s": output.transfer.exposed_s,
                }
            )
        error = error or output.error
        if output.error_kind:
            span.set({"minipd.error_kind": output.error_kind})
    span.end(error)
