"""The router's state of one request, and the measured figures of its KV transfer."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import msgspec

from minipd.control.messages import CallError, KVLanded, TokenOutput
from minipd.engine.request import RequestOutput, TransferInfo
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minipd.router.continued_text import ContinuedText
    from minipd.router.registry import InstanceHandle
    from minipd.router.request_timeline import RequestTimeline, TryTimes
    from minipd.router.timeline_store import TimelineStore
    from minipd.tracing.spans import Span


class RoutedRequest:
    def __init__(
        self,
        request_id: str,
        token_ids: list[int],
        params: SamplingParams,
        stream: RequestStream,
        layerwise: bool,
        timelines: TimelineStore | None = None,
    ):
        self.request_id = request_id
        self.wire_id = request_id  # the current try's id on the instances (see try_ids.py)
        self.token_ids = token_ids  # the current try's prompt (a migrated one's ends with the tokens relayed)
        self.params = params  # the current try's parameters
        self.prompt_ids = token_ids  # the caller's prompt and parameters (router/migration.py)
        self.original_params = params
        self.generated: list[int] = []  # every token relayed to the caller so far (kept with migration on)
        self.output_offset = 0  # tokens relayed before the current try (a migrated request's)
        self.num_migrations = 0
        self.num_text_sent = 0  # characters of text relayed to the caller (counted with migration on)
        self.continued_text: ContinuedText | None = None  # a migrated request's text, made by the router
        self.stream = stream
        self.layerwise = layerwise  # stream the KV per layer during prefill, or send it afterwards
        self.instances: set[str] = set()  # every instance that may hold state for it
        self.first_token_sent = False
        self.task: asyncio.Task | None = None
        self.transfer: TransferInfo | None = None
        self.timestamps = (0.0, 0.0)  # prefill's (compute end, first write), time.time()
        self.outputs: asyncio.Queue[TokenOutput | CallError] | None = None  # set while an instance streams it
        # The current try's instances, while its KV moves (for lease renewals and KV failures).
        self.decode: InstanceHandle | None = None
        self.prefill: InstanceHandle | None = None
        self.kv_failure: asyncio.Future[str] | None = None  # resolves if the decode side says the KV is lost
        # for latency observers (the ratio controller): time.monotonic() stamps
        self.arrival_s = time.monotonic()
        self.first_token_s = 0.0
        self.last_token_s: float | None = None
        self.num_later_tokens = 0  # output tokens after the first, relayed so far
        self.reserve_s = 0.0  # the last try's reserve call on its decode instance, busy waits included
        self.decode_wait_s = 0.0  # waiting for KV room on a decode instance (its pool was full)
        self.prefilled_locally = False  # placed on its decode instance for prefill too
        # its spans (router/request_spans.py), None while it is not traced
        self.span: Span | None = None
        self.try_span: Span | None = None  # the current try's (or its recompute's): the instances' parent
        # its stamps (request_timeline.py), kept in `timelines` when it ends; None: the router keeps none
        self.timeline: RequestTimeline | None = None
        if timelines is not None:
            self.timeline = timelines.start(request_id, self.arrival_s, len(token_ids))

    @property
    def times(self) -> TryTimes | None:
        """The current try's stamps (None: no timeline kept, or past its tries' bound)."""
        return None if self.timeline is None else self.timeline.current

    def decode_wait_so_far(self, now: float) -> float:
        """Time this request has spent waiting on decode: for KV room, or, prefilled on its
        decode instance, all of it (it queues there behind the decodes)."""
        return now - self.arrival_s if self.prefilled_locally else self.decode_wait_s

    def kv_failed(self, error: str) -> None:
        """The decode instance reports that the KV of the current try will not land."""
        if self.kv_failure is not None and not self.kv_failure.done():
            self.kv_failure.set_result(error)

    def end(self, last: RequestOutput) -> None:
        """Hand the caller the request's final output (and keep its timeline, if it has one)."""
        if self.timeline is not None:
            self.timeline.end(last)
        self.stream.put(last)

    def record_landing(self, landed: KVLanded) -> None:
        """Measure the transfer to the receiver's landing time (the last byte acknowledged),
        which replaces the sender's view; both clocks are wall clocks, exact on one host.
        `landed.adopt_s`: the decode instance's adopt that followed, as it measured it."""
        if self.timeline is not None:
            self.timeline.kv_landed(landed.landed_after_s, landed.ordered_after_s, landed.adopt_s)
        if self.transfer is None:
            return
        landed_at, adopt_s = landed.landed_at, landed.adopt_s
        compute_end_at, first_write_at = self.timestamps
        self.transfer = msgspec.structs.replace(
            self.transfer,
            transfer_s=max(0.0, landed_at - first_write_at),
            exposed_s=max(0.0, landed_at - compute_end_at),
            adopt_s=adopt_s,
        )
