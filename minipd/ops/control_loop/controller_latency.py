"""The latencies behind the live ratio controller's decisions, as figures an operator can read.

The policy weighs attainments (shares within the SLO); this keeps the latencies themselves,
over the same window (the policy's `window_start`: its window, cut at its last move), so that
/metrics can show, at the policy's target quantile (p90 for a target of 0.9):

- estimated TTFT: what the policy blames on prefill, each first token's TTFT less its wait for
  decode room (a request marked late counts with what it had waited then, less that wait, as
  the policy counts it: only when the wait was not decode's);
- observed TTFT: the TTFT at the router, decode wait included (a late request counts with
  what it had waited when marked);
- estimated ITL: the per-token figure the policy judges, each token's gap to its request's
  previous one under an `itl` objective, its request's time per output token so far under `tpot`;
- observed ITL: each token's gap to its request's previous one.
Token figures are weighted by the tokens of the output that carried them. Each quantile is
None while its window holds no sample.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable


def weighted_quantile(samples: Iterable[tuple[float, int]], q: float) -> float | None:
    """The smallest value at or below which at least `q` of the weight lies; None with no weight."""
    ordered = sorted(samples)
    total = sum(weight for _, weight in ordered)
    if not total:
        return None
    needed, seen = q * total, 0
    for value, weight in ordered:
        seen += weight
        if seen >= needed:
            return value
    return ordered[-1][0]


class _Window:
    """(time, estimated, observed, weight) samples, oldest first."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float | None, float, int]] = deque()

    def add(self, now: float, estimated: float | None, observed: float, weight: int = 1) -> None:
        self.samples.append((now, estimated, observed, weight))

    def prune(self, start: float) -> None:
        while self.samples and self.samples[0][0] < start:
            self.samples.popleft()

    def quantiles(self, q: float) -> tuple[float | None, float | None]:
        estimated = weighted_quantile(((e, w) for _, e, _, w in self.samples if e is not None), q)
        observed = weighted_quantile(((o, w) for _, _, o, w in self.samples), q)
        return estimated, observed


class ControllerLatencies:
    """Fed what the live controller feeds its policy; `quantiles(now)` answers the four figures."""

    def __init__(self, quantile: float, tpot_objective: bool, decode_wait_limit_s: float):
        self.quantile = quantile
        self._tpot = tpot_objective
        self._decode_wait_limit_s = decode_wait_limit_s  # a longer wait is decode's, as the policy judges
        self._ttft = _Window()
        self._tokens = _Window()

    def first_token(self, now: float, ttft_s: float, decode_wait_s: float) -> None:
        self._ttft.add(now, ttft_s - decode_wait_s, ttft_s)

    def late(self, now: float, waited_s: float, decode_wait_s: float) -> None:
        prefill_s = waited_s - decode_wait_s if decode_wait_s <= self._decode_wait_limit_s else None
        self._ttft.add(now, prefill_s, waited_s)

    def tokens(self, now: float, gap_s: float, count: int, tpot_s: float) -> None:
        self._tokens.add(now, tpot_s if self._tpot else gap_s, gap_s, count)

    def prune(self, start: float) -> None:
        """Forget samples from before `start` (the policy's window start)."""
        self._ttft.prune(start)
        self._tokens.prune(start)

    def quantiles(self, start: float) -> dict[str, float | None]:
        """{"estimated_ttft", "observed_ttft", "estimated_itl", "observed_itl"}: seconds, over
        the samples since `start`; None where there is none."""
        self.prune(start)
        est_ttft, obs_ttft = self._ttft.quantiles(self.quantile)
        est_itl, obs_itl = self._tokens.quantiles(self.quantile)
        figures = {
            "estimated_ttft": est_ttft,
            "observed_ttft": obs_ttft,
            "estimated_itl": est_itl,
            "observed_itl": obs_itl,
        }
        return {k: v if v is None or math.isfinite(v) else None for k, v in figures.items()}
