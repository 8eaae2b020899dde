"""The simulator's gap histogram: percentiles exact to its bin width, and two histograms added
together give the percentiles of all their values; histograms of other bins are refused."""

from __future__ import annotations

import numpy as np
import pytest

from minipd.slo.histogram import LogHistogram


def _of(values: np.ndarray, **bins) -> LogHistogram:
    h = LogHistogram(**bins)
    h.add(values)
    return h


def test_percentiles_are_exact_to_the_bin_width():
    values = np.random.default_rng(1).lognormal(np.log(0.02), 0.5, 50_000)
    h = _of(values)
    for p in (10, 50, 90, 99):
        assert h.percentile(p) == pytest.approx(np.percentile(values, p), rel=0.003)
    assert h.count == len(values) and np.isnan(LogHistogram().percentile(50))


def test_adding_a_histogram_pools_the_values_of_both():
    rng = np.random.default_rng(2)
    fast, slow = rng.uniform(0.01, 0.02, 30_000), rng.uniform(0.03, 0.05, 10_000)
    pooled = _of(fast)
    pooled.add_histogram(_of(slow))
    both = np.concatenate([fast, slow])
    assert pooled.count == len(both)
    for p in (50, 80, 95):
        assert pooled.percentile(p) == pytest.approx(np.percentile(both, p), rel=0.003)
    with pytest.raises(ValueError, match="same bins"):
        pooled.add_histogram(_of(slow, rel_width=0.01))
