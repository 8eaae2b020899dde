"""Between a fetched value and the caller's buffers: the verification every value passes before
one byte of it is copied, and a gate that shuts when the fetch returns, so that nothing lands in
the caller's buffers afterwards, even from a store call that outlived its timeout in a thread."""

from __future__ import annotations

import threading
from typing import Sequence

from minipd.kvtier.block_header import HEADER_BYTES, header_mismatch, payload_mismatch
from minipd.kvtier.buffers import byte_view


class FetchGate:
    """One fetch's verification and copies. `consume(i, value)` (any thread) checks the i-th
    value against the block asked for (model digest, block size, chain digest, length, CRC) and,
    if it passes, copies its payload into `destinations[i]` and marks `fetched[i]`; a value that
    fails is recorded in `failures` with the reason and copied nowhere. After `close()` returns,
    `consume` does nothing: `fetched` is final, and True exactly where a destination was written."""

    def __init__(
        self, model_digest: bytes, block_size: int, chains: Sequence[bytes], destinations: Sequence[list[memoryview]]
    ) -> None:
        self._model_digest, self._block_size, self._chains = model_digest, block_size, chains
        self._destinations = destinations
        self.payload_lengths = [sum(d.nbytes for d in dest) for dest in destinations]
        self.fetched = [False] * len(destinations)
        self.failures: list[tuple[int, str]] = []
        # Held while a payload is copied: close() waits out at most one block's copy.
        self._lock = threading.Lock()
        self._closed = False

    @property
    def value_lengths(self) -> list[int]:
        return [HEADER_BYTES + n for n in self.payload_lengths]

    def consume(self, index: int, value: memoryview | bytes) -> None:
        if self._closed:
            return
        value = byte_view(value)
        reason = self._mismatch(index, value)
        with self._lock:
            if self._closed:
                return
            if reason is not None:
                self.failures.append((index, reason))
                return
            offset = HEADER_BYTES
            for dest in self._destinations[index]:
                dest[:] = value[offset : offset + dest.nbytes]
                offset += dest.nbytes
            self.fetched[index] = True

    def fail(self, index: int, reason: str) -> None:
        """Record a failure the backend found before any bytes arrived (a value of another length)."""
        with self._lock:
            if not self._closed:
                self.failures.append((index, reason))

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _mismatch(self, index: int, value: memoryview) -> str | None:
        expected = self.payload_lengths[index]
        reason = header_mismatch(
            value[:HEADER_BYTES], self._model_digest, self._block_size, self._chains[index], expected
        )
        if reason is not None:
            return reason
        if value.nbytes != HEADER_BYTES + expected:
            return "truncated" if value.nbytes < HEADER_BYTES + expected else "payload length"
        return payload_mismatch(value[:HEADER_BYTES], [value[HEADER_BYTES:]])
