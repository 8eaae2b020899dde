"""A bound on the bytes of stores in flight, taken on the event loop and given back from any
thread (a Mooncake put may finish in its worker thread long after the store call timed out)."""

from __future__ import annotations

import threading


class ByteBudget:
    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the bytes-in-flight bound must be positive, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def take(self, nbytes: int) -> bool:
        """Take `nbytes` if they fit under the limit (True), else take nothing (False)."""
        with self._lock:
            if self._in_flight + nbytes > self.limit:
                return False
            self._in_flight += nbytes
            return True

    def reservation(self, nbytes: int) -> Reservation:
        """A handle that gives `nbytes` (already taken) back once, however often it is released."""
        return Reservation(self, nbytes)

    def _give(self, nbytes: int) -> None:
        with self._lock:
            self._in_flight -= nbytes


class Reservation:
    def __init__(self, budget: ByteBudget, nbytes: int) -> None:
        self._budget, self._nbytes = budget, nbytes
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            nbytes, self._nbytes = self._nbytes, 0
        if nbytes:
            self._budget._give(nbytes)
