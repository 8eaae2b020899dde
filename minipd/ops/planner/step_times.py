"""A growing float64 array: the end time of every step of one instance."""

from __future__ import annotations

import numpy as np

INITIAL_CAPACITY = 1024


class StepTimes:
    """Append-only; `window(i, j)` is a view of steps i..j-1 without copying, so a request's
    token times are read straight from its instance's step times."""

    __slots__ = ("_data", "n")

    def __init__(self) -> None:
        self._data = np.empty(INITIAL_CAPACITY)
        self.n = 0

    def append(self, t: float) -> None:
        if self.n == len(self._data):
            grown = np.empty(2 * len(self._data))
            grown[: self.n] = self._data
            self._data = grown
        self._data[self.n] = t
        self.n += 1

    def window(self, start: int, stop: int) -> np.ndarray:
        if not 0 <= start <= stop <= self.n:
            raise IndexError(f"steps {start}..{stop} outside 0..{self.n}")
        return self._data[start:stop]
