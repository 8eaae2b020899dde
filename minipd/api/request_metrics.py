"""What one request records into its front's metrics (metrics.py `ServingMetrics`), as it goes:
`RequestRecorder`, one per request, from its arrival to its last output; the names of the
phases and abort causes it records; and the front's recent requests (`RecentRequests`), kept
for the dashboard's window (ops/dashboard/request_window.py) to read later.

metrics.py owns the registry and the series (their names, units and buckets); this module only
observes into them, so a request runs nothing of the registry's set-up or of a scrape.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

from prometheus_client import Counter, Histogram

from minipd.engine.request import FinishReason, RequestOutput, TransferInfo

# minipd_disagg_phase_seconds{phase}, in the order a disaggregated request goes through them
PHASE_RESERVE = "reserve"  # the router's reserve call on the decode instance, busy waits included
PHASE_PREFILL_COMPUTE = "prefill_compute"  # the prefill instance's prefill step
PHASE_KV_TRANSFER = "kv_transfer"  # first KV write to the last byte acknowledged
PHASE_KV_TRANSFER_EXPOSED = "kv_transfer_exposed"  # end of prefill compute to the last byte acknowledged
# decode side: the KV landed and the decode order arrived (the later of the two) to the
# sequence queued with its first token (the landing checked, the blocks adopted)
PHASE_ADOPT = "adopt"
PHASE_FIRST_TOKEN = "first_token"  # arrival at this front to the first token leaving it
PHASES = (
    PHASE_RESERVE,
    PHASE_PREFILL_COMPUTE,
    PHASE_KV_TRANSFER,
    PHASE_KV_TRANSFER_EXPOSED,
    PHASE_ADOPT,
    PHASE_FIRST_TOKEN,
)

ABORT_CLIENT_DISCONNECT = "client_disconnect"
ABORT_ENGINE_ERROR = "engine_error"
ABORT_OTHER = "other"  # aborted inside the backend (shutdown, lost instance)


RECENT_SAMPLES = 100_000  # per kind of sample: beyond it the oldest go first (a burst costs bounded memory)
RECENT_FINISHED = 50  # finished requests kept with their last output (the dashboard's request table)


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


class RecentRequests:
    """What a front's requests measured lately, kept for a reader that may come later (the
    dashboard's window): TTFT samples (from the backend's taking the request to its first
    token leaving the front) and inter-token gaps, each stamped `time.monotonic()` when
    measured; the KV each finished request moved, `(at, prefill, decode, bytes)`; the last
    finished requests, `(time.time(), last output, TTFT, mean gap)`; and totals since start.
    Each is a bounded ring, oldest out first: pruning and summarising are the reader's."""

    def __init__(self, max_samples: int = RECENT_SAMPLES, max_finished: int = RECENT_FINISHED):
        self.ttft = Samples(max_samples)
        self.itl = Samples(max_samples)
        self.transfers: deque[tuple[float, str, str, int]] = deque(maxlen=max_samples)
        self.finished: deque[tuple[float, RequestOutput, float | None, float | None]] = deque(maxlen=max_finished)
        self.num_requests = 0  # finished since start
        self.num_kv_bytes = 0  # moved since start

    def finish(self, at: float, output: RequestOutput, ttft_s: float | None, mean_itl_s: float | None) -> None:
        """A request ended `at` with `output` (an abort's when the front left it unfinished)."""
        transfer = output.transfer
        if transfer is not None:
            self.transfers.append((at, transfer.prefill_instance, transfer.decode_instance, transfer.num_bytes))
            self.num_kv_bytes += transfer.num_bytes
        self.finished.append((time.time(), output, ttft_s, mean_itl_s))
        self.num_requests += 1


class FrontSeries(Protocol):
    """The series of a front that a request observes into (metrics.py's `ServingMetrics`, which
    names them and sets their buckets), and its recent requests."""

    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue: Histogram
    transfer: Histogram
    transfer_exposed: Histogram
    phases: Histogram
    requests: Counter
    prompt_tokens: Counter
    generation_tokens: Counter
    transfer_bytes: Counter
    aborts: Counter
    recent: RecentRequests


def record_transfer(m: FrontSeries, num_bytes: int, seconds: float, exposed_seconds: float) -> None:
    """One request's KV transfer finished: its size, wall time and exposed part."""
    m.transfer_bytes.inc(num_bytes)
    m.transfer.observe(seconds)
    m.transfer_exposed.observe(exposed_seconds)


def record_phases(m: FrontSeries, transfer: TransferInfo, ttft_s: float | None) -> None:
    """A disaggregated request finished: the phases its transfer record carries, and its TTFT
    (None when no token reached the client, which then has no first-token phase; an adopt
    the decode instance did not report has no adopt phase)."""
    for phase, seconds in (
        (PHASE_RESERVE, transfer.reserve_s),
        (PHASE_PREFILL_COMPUTE, transfer.compute_s),
        (PHASE_KV_TRANSFER, transfer.transfer_s),
        (PHASE_KV_TRANSFER_EXPOSED, transfer.exposed_s),
        (PHASE_ADOPT, transfer.adopt_s),
        (PHASE_FIRST_TOKEN, ttft_s),
    ):
        if seconds is not None:
            m.phases.labels(phase).observe(seconds)


class RequestRecorder:
    """Times one request from arrival; each method records at most once where that matters.
    Its figures for `ServingMetrics.recent` count from `submitted` (the backend took it)."""

    def __init__(self, metrics: FrontSeries):
        self._metrics = metrics
        self._arrival = time.monotonic()
        self._submitted = self._arrival
        self._request_id = ""
        self._first_token_time: float | None = None
        self._last_token_time: float | None = None
        self._num_gaps = 0
        self._ttft_s: float | None = None
        self._queue_recorded = False
        self._num_prompt_tokens = 0
        self._num_output_tokens = 0
        self.is_finished = False
        self._kept = False  # in `recent`

    def submitted(self, request_id: str) -> None:
        """The backend took the request as `request_id`: its outputs follow."""
        self._submitted, self._request_id = time.monotonic(), request_id

    def on_output(self, output: RequestOutput) -> None:
        """An increment arrived from the backend and is about to be sent to the client."""
        m, now = self._metrics, time.monotonic()
        if output.queue_time_s is not None and not self._queue_recorded:
            m.queue.observe(output.queue_time_s)
            self._queue_recorded = True
        if output.token_ids:
            if self._last_token_time is None:
                self._ttft_s = now - self._arrival
                m.ttft.observe(self._ttft_s)
                self._first_token_time = now
                m.recent.ttft.append(now, now - self._submitted)
            else:
                gap = now - self._last_token_time
                m.itl.observe(gap)
                m.recent.itl.append(now, gap)
                self._num_gaps += 1
            self._last_token_time = now
            m.generation_tokens.inc(len(output.token_ids))
        self._num_prompt_tokens = output.num_prompt_tokens
        self._num_output_tokens = output.num_output_tokens
        if output.finished and not self._kept:
            self._keep(output)
        if output.finished:
            if output.transfer is not None:
                record_transfer(m, output.transfer.num_bytes, output.transfer.transfer_s, output.transfer.exposed_s)
                record_phases(m, output.transfer, self._ttft_s)
            if output.error is not None:
                m.aborts.labels(ABORT_ENGINE_ERROR).inc()
            elif output.finish_reason == FinishReason.ABORT.value:
                m.aborts.labels(ABORT_OTHER).inc()
            self._finish(output.finish_reason or FinishReason.ABORT.value)

    def left(self) -> None:
        """The front is done with the request's stream: one that gave no final output is kept
        in `recent` as aborted (the client went away, or the stream broke off)."""
        if not self._kept:
            self._keep(
                RequestOutput(request_id=self._request_id, token_ids=[], text="", finished=True, finish_reason="abort")
            )

    def _keep(self, last: RequestOutput) -> None:
        self._kept = True
        first, last_token = self._first_token_time, self._last_token_time
        ttft = None if first is None else first - self._submitted
        mean_itl = (last_token - first) / self._num_gaps if self._num_gaps else None
        self._metrics.recent.finish(time.monotonic(), last, ttft, mean_itl)

    def on_disconnect(self) -> None:
        """The client went away before the request finished (the backend aborts it)."""
        if not self.is_finished:
            self._metrics.aborts.labels(ABORT_CLIENT_DISCONNECT).inc()
            self._finish(FinishReason.ABORT.value)

    def _finish(self, finish_reason: str) -> None:
        self.is_finished = True
        m = self._metrics
        m.e2e.observe(time.monotonic() - self._arrival)
        m.requests.labels(finish_reason).inc()
        m.prompt_tokens.inc(self._num_prompt_tokens)
