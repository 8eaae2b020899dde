"""The router's state of one request across its tries, and the measured figures of its KV
transfer; what one try knows is its own (try_state.py)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import msgspec

from minipd.control.messages import KVLanded
from minipd.engine.request import TransferInfo
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minipd.router.continued_text import ContinuedText
    from minipd.tracing.spans import Span


class RoutedRequest:
    def __init__(
        self,
        request_id: str,
        token_ids: list[int],
        params: SamplingParams,
        stream: RequestStream,
        layerwise: bool,
    ):
        self.request_id = request_id
        self.wire_id = request_id  # the current try's id on the instances (see try_state.py:TryIds)
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
        self.task: asyncio.Task | None = None
        self.transfer: TransferInfo | None = None  # the KV transfer its final output reports
        self.timestamps = (0.0, 0.0)  # prefill's (compute end, first write), time.time()
        # for latency observers (the ratio controller): time.monotonic() stamps
        self.arrival_s = time.monotonic()
        self.first_token_s = 0.0
        self.last_token_s: float | None = None  # None: no token reached the caller yet
        self.num_later_tokens = 0  # output tokens after the first, relayed so far
        self.decode_wait_s = 0.0  # waiting for KV room on a decode instance (its pool was full)
        self.prefilled_locally = False  # the current try placed it on its decode instance for prefill too
        # kept by the subscribers of the router's request events, None without them:
        self.span: Span | None = None  # its span (request_spans.py), while it is traced
        self.log: list | None = None  # its events so far, while the router keeps timelines (request_log.py)

    @property
    def first_token_sent(self) -> bool:
        return self.last_token_s is not None

    def decode_wait_so_far(self, now: float) -> float:
        """Time this request has spent waiting on decode: for KV room, or, prefilled on its
        decode instance, all of it (it queues there behind the decodes)."""
        return now - self.arrival_s if self.prefilled_locally else self.decode_wait_s

    def record_landing(self, landed: KVLanded) -> None:
        """Measure the transfer to the receiver's landing time (the last byte acknowledged),
        which replaces the sender's view; both clocks are wall clocks, exact on one host.
        `landed.adopt_s`: the decode instance's adopt that followed, as it measured it."""
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
