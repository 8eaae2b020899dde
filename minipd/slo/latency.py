"""Latency statistics in seconds: the mean, median, spread and the percentiles that `vllm bench
serve` prints, of a run's TTFTs, TPOTs, gaps or end-to-end latencies.

Percentiles interpolate linearly between the closest ranks (numpy's default), so P50 is the
median. NaN values (no measurement) are left out; with no values every figure is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from minipd.slo.histogram import LogHistogram

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float] | np.ndarray, p: float) -> float:
    """The p-th percentile (0 <= p <= 100) by linear interpolation; NaN for no values."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile: p must be in [0, 100], got {p}")
    if not len(values):
        return math.nan
    return float(np.percentile(values, p))


class LatencyStats(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds; `count` is how many values they summarize."""

    mean: float
    median: float
    std: float  # population standard deviation
    p50: float
    p90: float
    p99: float
    count: int

    @classmethod
    def of(cls, seconds: Sequence[float] | np.ndarray) -> LatencyStats:
        values = np.asarray(seconds, dtype=float)
        values = values[~np.isnan(values)]
        if not len(values):
            return cls.empty()
        p50, p90, p99 = (float(v) for v in np.percentile(values, PERCENTILES))
        return cls(
            mean=float(values.mean()), median=p50, std=float(values.std()), p50=p50, p90=p90, p99=p99, count=len(values)
        )

    @classmethod
    def of_histogram(cls, histogram: LogHistogram) -> LatencyStats:
        """Percentiles to within the histogram's bin width; it keeps no mean or spread (NaN)."""
        p50, p90, p99 = (histogram.percentile(p) for p in PERCENTILES)
        return cls(mean=math.nan, median=p50, std=math.nan, p50=p50, p90=p90, p99=p99, count=histogram.count)

    @classmethod
    def empty(cls) -> LatencyStats:
        nan = math.nan
        return cls(mean=nan, median=nan, std=nan, p50=nan, p90=nan, p99=nan, count=0)
