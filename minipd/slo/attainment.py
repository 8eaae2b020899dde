"""Which requests meet an SLO, and the share that did (the SLO attainment).

A request is *good* when it meets every objective given. A measurement that is NaN (a
request of one output token has no gaps, so no TPOT or ITL) meets its objective.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from minipd.slo.targets import SLO

ArrayLike = Sequence[float] | np.ndarray


def meets(slo: SLO, *, ttft_s: ArrayLike, tpot_s: ArrayLike, itl_s: ArrayLike, e2e_s: ArrayLike) -> np.ndarray:
    """Per request (one value each, seconds; `itl_s` is the request's own P90 gap): does it
    meet every objective of `slo`? All True when there are none."""
    ok = np.ones(len(ttft_s), dtype=bool)
    for bound, values in ((slo.ttft_s, ttft_s), (slo.tpot_s, tpot_s), (slo.itl_s, itl_s), (slo.e2e_s, e2e_s)):
        if bound is not None:
            ok &= np.nan_to_num(np.asarray(values, dtype=float), nan=0.0) <= bound
    return ok


def attainment(good: ArrayLike) -> float:
    """The share of requests that were good; NaN for no requests."""
    return float(np.mean(good)) if len(good) else math.nan
