"""What an HTTP front's requests measured lately: the dashboard's sliding window.

`observed_backend.ObservedBackend` reports every output of every request here, with the
instants the front relays them: a request's first token gives its TTFT (from its submission to
the backend), every later token-carrying output one inter-token gap, and its final output the
request's record (tokens, KV transfer, error). The window keeps the samples of the last
`window_s` seconds (and at most `max_samples` of each kind: beyond that the oldest go first, so a
burst costs bounded memory), the last `max_records` request records, and totals since start
(which agree with /metrics' counters: both count the front's finished requests).

Timestamps are `time.monotonic()`; records carry `time.time()` for display.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

import msgspec
import numpy as np

from minipd.engine.request import RequestOutput

DEFAULT_WINDOW_S = 60.0
DEFAULT_MAX_SAMPLES = 100_000  # per kind: beyond it the window is shorter than window_s, percentiles as good
DEFAULT_MAX_RECORDS = 50  # the request table's rows


class RequestRecord(msgspec.Struct, kw_only=True):
    """One finished request, as the page's request table shows it."""

    request_id: str
    finished_at: float  # time.time()
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None  # None: no token came
    mean_itl_s: float | None  # None: fewer than two token-carrying outputs
    finish_reason: str
    error: str | None = None
    prefill_instance: str | None = None  # None: prefilled where it decoded (no KV moved)
    decode_instance: str | None = None
    kv_bytes: int = 0
    transfer_s: float = 0.0
    exposed_s: float = 0.0  # the transfer's part after prefill compute ended
    compute_s: float = 0.0  # the prefill step
    reserve_s: float = 0.0


class Samples:
    """Timed samples, oldest first, at most `capacity` (the oldest go first beyond it); times
    and values in two deques, so the values reach numpy without a tuple per sample."""

    def __init__(self, capacity: int):
        self.at: deque[float] = deque(maxlen=capacity)
        self.values: deque[float] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.values)

    def append(self, at: float, value: float) -> None:
        self.at.append(at)
        self.values.append(value)

    def drop_before(self, horizon: float) -> None:
        at, values = self.at, self.values
        while at and at[0] < horizon:
            at.popleft()
            values.popleft()

    def array(self) -> np.ndarray:
        return np.fromiter(self.values, dtype=float, count=len(self.values))


class _Transfer(msgspec.Struct, frozen=True):
    at: float  # monotonic
    prefill: str
    decode: str
    num_bytes: int


class RequestWindow:
    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        max_records: int = DEFAULT_MAX_RECORDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not window_s > 0:
            raise ValueError(f"window_s: must be positive, got {window_s}")
        self.window_s, self.clock = window_s, clock
        self.ttft = Samples(max_samples)  # seconds, stamped with when they were measured
        self.itl = Samples(max_samples)
        self.transfers: deque[_Transfer] = deque(maxlen=max_samples)
        self.records: deque[RequestRecord] = deque(maxlen=max_records)
        self.num_requests = 0  # finished since start
        self.num_kv_bytes = 0  # moved since start

    # ---- fed by the observed backend ----------------------------------------------------
    def first_token(self, ttft_s: float) -> None:
        self.ttft.append(self.clock(), ttft_s)

    def gap(self, gap_s: float) -> None:
        self.itl.append(self.clock(), gap_s)

    def finished(self, output: RequestOutput, ttft_s: float | None, mean_itl_s: float | None) -> None:
        transfer = output.transfer
        record = RequestRecord(
            request_id=output.request_id,
            finished_at=time.time(),
            prompt_tokens=output.num_prompt_tokens,
            output_tokens=output.num_output_tokens,
            ttft_s=ttft_s,
            mean_itl_s=mean_itl_s,
            finish_reason=output.finish_reason or "abort",
            error=output.error,
        )
        if transfer is not None:
            record.prefill_instance, record.decode_instance = transfer.prefill_instance, transfer.decode_instance
            record.kv_bytes, record.transfer_s, record.exposed_s = (
                transfer.num_bytes,
                transfer.transfer_s,
                transfer.exposed_s,
            )
            record.compute_s, record.reserve_s = transfer.compute_s, transfer.reserve_s
            self.transfers.append(
                _Transfer(self.clock(), transfer.prefill_instance, transfer.decode_instance, transfer.num_bytes)
            )
            self.num_kv_bytes += transfer.num_bytes
        self.records.append(record)
        self.num_requests += 1

    # ---- read by the snapshot -------------------------------------------------------------
    def prune(self) -> None:
        """Drop the samples older than the window."""
        horizon = self.clock() - self.window_s
        self.ttft.drop_before(horizon)
        self.itl.drop_before(horizon)
        while self.transfers and self.transfers[0].at < horizon:
            self.transfers.popleft()

    def ttft_values(self) -> np.ndarray:
        return self.ttft.array()

    def itl_values(self) -> np.ndarray:
        return self.itl.array()

    def link_bytes(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(prefill, decode) -> (KV bytes, requests) moved over that pair within the window."""
        pairs: dict[tuple[str, str], tuple[int, int]] = {}
        for t in self.transfers:
            num_bytes, count = pairs.get((t.prefill, t.decode), (0, 0))
            pairs[(t.prefill, t.decode)] = (num_bytes + t.num_bytes, count + 1)
        return pairs
