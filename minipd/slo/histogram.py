"""Percentiles of many values (every inter-token gap of a run) in constant memory.

Values are counted in log-spaced bins of ratio `1 + rel_width`, so a percentile is exact to
within that relative width; values below `low` share the first bin. Values are buffered and
binned in vectorised batches.
"""

from __future__ import annotations

import math

import numpy as np

FLUSH_AT = 1 << 18


class LogHistogram:
    def __init__(self, low: float = 1e-6, high: float = 1e4, rel_width: float = 0.002):
        self.low = low
        self._log_ratio = math.log1p(rel_width)
        self.num_bins = math.ceil(math.log(high / low) / self._log_ratio) + 1
        self.counts = np.zeros(self.num_bins, dtype=np.int64)
        self._pending: list[np.ndarray] = []
        self._num_pending = 0

    def add(self, values: np.ndarray) -> None:
        self._pending.append(values)
        self._num_pending += len(values)
        if self._num_pending >= FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        values = np.concatenate(self._pending)
        self._pending, self._num_pending = [], 0
        with np.errstate(divide="ignore"):
            bins = np.floor(np.log(np.maximum(values, self.low) / self.low) / self._log_ratio)
        self.counts += np.bincount(np.clip(bins, 0, self.num_bins - 1).astype(np.int64), minlength=self.num_bins)

    def add_histogram(self, other: LogHistogram) -> None:
        """Count every value of `other` too (which must have the same bins)."""
        if (other.low, other._log_ratio, other.num_bins) != (self.low, self._log_ratio, self.num_bins):
            raise ValueError("log histogram: can only add a histogram with the same bins")
        other._flush()
        self._flush()
        self.counts += other.counts

    @property
    def count(self) -> int:
        self._flush()
        return int(self.counts.sum())

    def fraction_at_most(self, bound: float) -> float:
        """The share of values at most `bound`, to within a bin (a value in `bound`'s bin counts
        as within it); nan when empty."""
        self._flush()
        total = int(self.counts.sum())
        if total == 0:
            return math.nan
        index = math.floor(math.log(max(bound, self.low) / self.low) / self._log_ratio)
        return float(self.counts[: min(self.num_bins, index + 1)].sum()) / total

    def percentile(self, p: float) -> float:
        """The p-th percentile (0 < p <= 100) as the geometric middle of its bin; nan when empty."""
        self._flush()
        total = int(self.counts.sum())
        if total == 0:
            return math.nan
        rank = max(1, math.ceil(p / 100 * total))
        index = int(np.searchsorted(np.cumsum(self.counts), rank))
        return self.low * math.exp((index + 0.5) * self._log_ratio)
