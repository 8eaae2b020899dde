"""What the client measured for one request, with the per-request metrics of `vllm bench serve`.

Times are seconds on the client's monotonic clock (`time.perf_counter`):
- TTFT: from sending the request to the first streamed event that carries a choice;
- ITL: every gap between consecutive such events (several tokens may share one event);
- E2EL: from sending the request to its last such event;
- TPOT: (E2EL - TTFT) / (output tokens - 1), output tokens as the server's `usage` reports
  them; 0 for a request of one output token (vLLM counts it so for goodput).
Whether requests met an SLO is `minipd.slo.attainment`'s rule, plus vLLM's: a failed request
is never good.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from minipd.slo.attainment import meets
from minipd.slo.latency import percentile
from minipd.slo.targets import SLO


class RequestRecord(msgspec.Struct, kw_only=True):
    index: int  # position in the workload
    scheduled_s: float  # when the workload said it arrives, from the start of the run
    sent_s: float  # when the client sent it, from the start of the run
    url: str
    prompt_len: int  # requested prompt tokens
    output_len: int  # requested output tokens (max_tokens, with ignore_eos)
    success: bool = False
    error: str | None = None
    ttft_s: float = 0.0
    itl_s: list[float] = []
    e2el_s: float = 0.0
    prompt_tokens: int = 0  # as the server counted them (usage.prompt_tokens)
    output_tokens: int = 0  # usage.completion_tokens, else the number of events
    usage_reported: bool = False

    @property
    def tpot_s(self) -> float:
        if self.output_tokens <= 1:
            return 0.0
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def finished_s(self) -> float:
        """When its last event arrived, from the start of the run."""
        return self.sent_s + self.e2el_s

    @property
    def gap_p90_s(self) -> float:
        """Its own 90th-percentile inter-token gap, what the `itl` objective bounds; NaN without gaps."""
        return percentile(self.itl_s, 90)


def good_requests(records: Sequence[RequestRecord], slo: SLO) -> np.ndarray:
    """Per request: did it succeed and meet every objective of `slo`?"""
    success = np.array([r.success for r in records], dtype=bool)
    measured = meets(
        slo,
        ttft_s=[r.ttft_s for r in records],
        tpot_s=[r.tpot_s for r in records],
        itl_s=[r.gap_p90_s for r in records],
        e2e_s=[r.e2el_s for r in records],
    )
    return success & measured


def num_good(records: Sequence[RequestRecord], slo: SLO) -> int:
    return int(good_requests(records, slo).sum())


def attainment(records: Sequence[RequestRecord], slo: SLO) -> float:
    """The share of all requests (failed ones included) that met `slo`; NaN for no requests."""
    return num_good(records, slo) / len(records) if records else math.nan
