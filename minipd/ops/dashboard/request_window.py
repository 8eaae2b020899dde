"""What an HTTP front's requests measured lately: the dashboard's sliding window.

The window reads a `RecentRequests` (api/request_metrics.py): the rings where the front's request
recorder keeps, with the instants the front relays them, each request's TTFT (from its
submission to the backend), every later token-carrying output's inter-token gap, and each final
output with the request's figures (tokens, KV transfer, error). A router's front reads the
front's own (`read`, when the dashboard is installed on it), so a request pays a few appends
for the window and nothing more; a window that reads no front's keeps its own, fed through
`first_token`, `gap` and `finished` (observed_backend.ObservedBackend, on a colocated front).
Read, it keeps the samples of the last `window_s` seconds (and at most `max_samples` of each
kind: beyond that the oldest go first, so a burst costs bounded memory), the last
`max_records` request records, and totals since start (which agree with /metrics' counters:
both count the front's finished requests).

Timestamps are `time.monotonic()`; records carry `time.time()` for display.
"""

from __future__ import annotations

import time
from typing import Callable

import msgspec
import numpy as np

from minipd.api.request_metrics import RecentRequests, Samples
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
        self.recent = RecentRequests(max_samples, max_records)

    def read(self, recent: RecentRequests) -> None:
        """Read `recent` (a front's, kept by its request recorder) from now on."""
        self.recent = recent

    # ---- fed by the observed backend (a window that reads no front's) -------------------
    def first_token(self, ttft_s: float) -> None:
        self.recent.ttft.append(self.clock(), ttft_s)

    def gap(self, gap_s: float) -> None:
        self.recent.itl.append(self.clock(), gap_s)

    def finished(self, output: RequestOutput, ttft_s: float | None, mean_itl_s: float | None) -> None:
        self.recent.finish(self.clock(), output, ttft_s, mean_itl_s)

    # ---- read by the snapshot -------------------------------------------------------------
    @property
    def ttft(self) -> Samples:
        """TTFT samples (seconds), stamped with when they were measured."""
        return self.recent.ttft

    @property
    def itl(self) -> Samples:
        return self.recent.itl

    @property
    def num_requests(self) -> int:
        """Finished since start."""
        return self.recent.num_requests

    @property
    def num_kv_bytes(self) -> int:
        """Moved since start."""
        return self.recent.num_kv_bytes

    @property
    def records(self) -> list[RequestRecord]:
        """The last finished requests, oldest first."""
        return [_record(*finished) for finished in self.recent.finished]

    def prune(self) -> None:
        """Drop the samples older than the window."""
        horizon = self.clock() - self.window_s
        self.recent.ttft.drop_before(horizon)
        self.recent.itl.drop_before(horizon)
        transfers = self.recent.transfers
        while transfers and transfers[0][0] < horizon:
            transfers.popleft()

    def ttft_values(self) -> np.ndarray:
        return _array(self.recent.ttft)

    def itl_values(self) -> np.ndarray:
        return _array(self.recent.itl)

    def link_bytes(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(prefill, decode) -> (KV bytes, requests) moved over that pair within the window."""
        pairs: dict[tuple[str, str], tuple[int, int]] = {}
        for _, prefill, decode, size in self.recent.transfers:
            num_bytes, count = pairs.get((prefill, decode), (0, 0))
            pairs[(prefill, decode)] = (num_bytes + size, count + 1)
        return pairs


def _array(samples: Samples) -> np.ndarray:
    return np.fromiter(samples.values, dtype=float, count=len(samples.values))


def _record(finished_at: float, output: RequestOutput, ttft_s: float | None, mean_itl_s: float | None) -> RequestRecord:
    record = RequestRecord(
        request_id=output.request_id,
        finished_at=finished_at,
        prompt_tokens=output.num_prompt_tokens,
        output_tokens=output.num_output_tokens,
        ttft_s=ttft_s,
        mean_itl_s=mean_itl_s,
        finish_reason=output.finish_reason or "abort",
        error=output.error,
    )
    t = output.transfer
    if t is not None:
        record.prefill_instance, record.decode_instance = t.prefill_instance, t.decode_instance
        record.kv_bytes, record.transfer_s, record.exposed_s = t.num_bytes, t.transfer_s, t.exposed_s
        record.compute_s, record.reserve_s = t.compute_s, t.reserve_s
    return record
