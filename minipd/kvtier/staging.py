"""Staging memory for a store that moves bytes only between registered regions (Mooncake):
one region, registered once, carved into allocations.

Fetched values always land here first, never straight in the caller's buffers: a store call
that outlives the tier's timeout in its thread would otherwise write into a KV block the
caller has since reused. Stored blocks whose buffers are not in a registered region are copied
here too; headers always are.
"""

from __future__ import annotations

import bisect
import threading
from typing import NamedTuple

import numpy as np

ALIGN = 64


class Allocation(NamedTuple):
    offset: int
    span: int  # the bytes taken: nbytes rounded up to ALIGN
    nbytes: int


class StagingArena:
    """First-fit allocations from one buffer, freed ranges merged with their neighbours; any
    thread may allocate and free."""

    def __init__(self, nbytes: int) -> None:
        if nbytes < ALIGN:
            raise ValueError(f"a staging arena needs at least {ALIGN} bytes, got {nbytes}")
        self.buffer = np.zeros(nbytes, dtype=np.uint8)  # zero-filled: its pages are touched now, not mid-fetch
        self.address = int(self.buffer.ctypes.data)
        self.nbytes = nbytes
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, nbytes)]  # (offset, span), sorted, never adjacent

    def alloc(self, nbytes: int) -> Allocation | None:
        """`nbytes` of the arena, or None when no free range is that long."""
        span = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self._lock:
            for i, (offset, length) in enumerate(self._free):
                if length >= span:
                    if length == span:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + span, length - span)
                    return Allocation(offset, span, nbytes)
        return None

    def free(self, allocation: Allocation) -> None:
        with self._lock:
            i = bisect.bisect(self._free, (allocation.offset, 0))
            offset, span = allocation.offset, allocation.span
            if i < len(self._free) and self._free[i][0] == offset + span:  # merge the range after
                span += self._free.pop(i)[1]
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:  # ... and the one before
                offset, span = self._free[i - 1][0], self._free[i - 1][1] + span
                i -= 1
                del self._free[i]
            self._free.insert(i, (offset, span))

    def view(self, allocation: Allocation) -> memoryview:
        return memoryview(self.buffer[allocation.offset : allocation.offset + allocation.nbytes])

    def free_bytes(self) -> int:
        with self._lock:
            return sum(span for _, span in self._free)
