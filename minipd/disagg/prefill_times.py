"""A prefill's times for the router's request timelines (`Prefill.timeline`: `Prefilled.times`).

Recorded at the points the prefill's spans use (kv_trace.py), whether or not tracing is on:
a chunk from its first layer's KV written to its last layer's (the sender's `on_layer` calls,
on the event loop), a layer's KV from its first write handed to the transport to its last
write completed, the compute from the engine's own stamps of the prompt's first and last step.
Every time is `time.perf_counter()` (the engine's and the sender's clock, monotonic) less the
instant the Prefill arrived, so nothing depends on how this host's clock compares with the
router's. Bounded: at most MAX_TIMELINE_CHUNKS chunks are timed (later ones are counted) and
one interval per layer is kept, however many chunks wrote it.
"""

from __future__ import annotations

import asyncio
import time

from minipd.control.messages import MAX_TIMELINE_CHUNKS, MAX_TIMELINE_LAYERS, PrefillTimes

UNSENT = (-1.0, -1.0)


class PrefillTimesRecorder:
    def __init__(self, num_layers: int, received_at: float | None = None):
        self.received_at = time.perf_counter() if received_at is None else received_at
        self.num_layers = num_layers
        self.num_chunks = 0
        self.chunks: list[tuple[float, float]] = []
        self._chunk_start: float | None = None
        self._layers = [[-1.0, -1.0] for _ in range(min(num_layers, MAX_TIMELINE_LAYERS))]
        self.compute: tuple[float, float] | None = None  # the engine's perf_counter stamps
        self.sent_at: float | None = None

    def on_layer(self, layer: int) -> None:
        """Layer `layer` of a chunk is written (its KV final for the chunk's tokens)."""
        now = time.perf_counter()
        if layer == 0:
            self.num_chunks += 1
            self._chunk_start = now
        if layer == self.num_layers - 1 and self._chunk_start is not None:
            if len(self.chunks) < MAX_TIMELINE_CHUNKS:
                self.chunks.append((self._chunk_start - self.received_at, now - self.received_at))
            self._chunk_start = None

    def layer_sent(self, layer: int, write: asyncio.Future) -> None:
        """A write of `layer` was handed to the transport; its completion ends the layer's interval."""
        if layer >= len(self._layers):
            return
        interval = self._layers[layer]
        if interval[0] < 0:
            interval[0] = time.perf_counter() - self.received_at
        write.add_done_callback(lambda _: self._landed(interval))

    def _landed(self, interval: list[float]) -> None:
        interval[1] = max(interval[1], time.perf_counter() - self.received_at)

    def finished(self, compute: tuple[float, float]) -> None:
        """Every write completed; `compute`: the engine's (first step began, last step ended)."""
        self.compute, self.sent_at = compute, time.perf_counter()

    def times(self) -> PrefillTimes:
        """What the reply carries, measured up to now (the reply is about to go)."""
        now = time.perf_counter()
        start, end = self.compute if self.compute is not None else (now, now)
        sent = self.sent_at if self.sent_at is not None else now
        return PrefillTimes(
            handled_s=now - self.received_at,
            compute_start_s=start - self.received_at,
            compute_end_s=end - self.received_at,
            sent_s=sent - self.received_at,
            num_chunks=self.num_chunks,
            chunks=list(self.chunks),
            layers=[(a, b) if a >= 0 and b >= 0 else UNSENT for a, b in self._layers],
        )
