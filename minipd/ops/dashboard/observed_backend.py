"""A `ServingBackend` that tells a `RequestWindow` what its requests measure, and is otherwise
the backend it wraps (every call and attribute is passed through).

Each stream `submit` returns is wrapped: as the front takes an output from it (the moment
before it relays it to the client) the first token-carrying one records a TTFT from the
submission, every later one a gap, and the final one the request's record. Nothing else
changes: aborting, leaving `async with` early and the outputs themselves are the inner stream's.
A stream left before its final output (the client went away) is recorded as an abort, as
/metrics counts it.

Given a `TimelineStore` (a colocated front, where no router keeps timelines), each request's
timeline is stamped here too, on this process's monotonic clock: `queued` from its submission
to its first step (the engine's `queue_time_s`), `generate` from there to its first token,
`decode` to its end (router/request_timeline.py).
"""

from __future__ import annotations

import time

from minipd.api.backend import OutputStream, ServingBackend
from minipd.engine.checked_prompt import CheckedPrompt
from minipd.engine.request import RequestOutput
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.router.timeline_store import TimelineStore


class ObservedBackend:
    def __init__(
        self,
        backend: ServingBackend,
        window: RequestWindow,
        timelines: TimelineStore | None = None,
        instance_name: str = "local",
    ):
        self.backend, self.window = backend, window
        self.timelines, self.instance_name = timelines, instance_name

    def __getattr__(self, name: str):  # model_name, tokenizer, ready, instance_stats, ...
        return getattr(self.backend, name)

    @property
    def max_model_len(self) -> int:  # properties of the backend are read each time, not copied
        return self.backend.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    def submit(self, prompt: CheckedPrompt, request_id: str, *, traceparent: str | None = None) -> OutputStream:
        stream = ObservedStream(self.backend.submit(prompt, request_id, traceparent=traceparent), self.window)
        if self.timelines is not None:
            stream.timeline = self.timelines.start(stream.request_id, stream._submitted, len(prompt.token_ids))
            times = stream.timeline.begin_try()
            times.decode, times.local = self.instance_name, True
        return stream


class ObservedStream:
    def __init__(self, inner: OutputStream, window: RequestWindow):
        self.inner, self.window = inner, window
        self.request_id = inner.request_id
        self._submitted = time.monotonic()
        self._first: float | None = None
        self._last: float | None = None
        self._num_gaps = 0
        self._iterator = None
        self._finished = False
        self.timeline = None  # a RequestTimeline, on a colocated front

    def abort(self) -> None:
        self.inner.abort()

    async def __aenter__(self) -> ObservedStream:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        if not self._finished:  # left before its final output (the client went away): /metrics counts an abort
            self._finished = True
            last = RequestOutput(
                request_id=self.request_id, token_ids=[], text="", finished=True, finish_reason="abort"
            )
            self.window.finished(last, *self._figures())
            if self.timeline is not None:
                self.timeline.end(last)
        return await self.inner.__aexit__(*exc)

    def __aiter__(self) -> ObservedStream:
        if self._iterator is None:
            self._iterator = self.inner.__aiter__()
        return self

    async def __anext__(self) -> RequestOutput:
        output = await self._iterator.__anext__()
        self._observe(output)
        return output

    def _observe(self, output: RequestOutput) -> None:
        now = time.monotonic()
        if self.timeline is not None:
            self._stamp(output)
        if output.token_ids:
            if self._first is None:
                self._first = now
                self.window.first_token(now - self._submitted)
            else:
                self.window.gap(now - self._last)
                self._num_gaps += 1
            self._last = now
        if output.finished and not self._finished:
            self._finished = True
            self.window.finished(output, *self._figures())

    def _stamp(self, output: RequestOutput) -> None:
        times = self.timeline.current
        if times is not None and times.stream_sent is None and output.queue_time_s is not None:
            # its first step, where the queue ends (never after this output: the clocks' granularity)
            times.stream_sent = min(self._submitted + output.queue_time_s, time.monotonic())
        if output.token_ids:
            self.timeline.token_relayed()
        if output.finished and self.timeline.ended is None:
            self.timeline.end(output)

    def _figures(self) -> tuple[float | None, float | None]:
        """(TTFT, mean gap) so far; None where there is none."""
        ttft = None if self._first is None else self._first - self._submitted
        mean_itl = (self._last - self._first) / self._num_gaps if self._num_gaps else None
        return ttft, mean_itl
