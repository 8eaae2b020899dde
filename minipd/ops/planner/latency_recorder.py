"""Records each request's latencies as the simulation produces them, and builds the result."""

from __future__ import annotations

import math

import numpy as np

from minipd.ops.planner.sim_request import SimRequest
from minipd.ops.planner.sim_result import SimResult
from minipd.slo.histogram import LogHistogram

REQUEST_ITL_PERCENTILE = 90  # a request's `itl` is this percentile of its own gaps


class LatencyRecorder:
    def __init__(self, num_requests: int):
        n = num_requests
        self.ttft, self.tpot, self.itl, self.itl_max, self.e2e = ([math.nan] * n for _ in range(5))
        self.gaps = LogHistogram()

    def first_token(self, request: SimRequest, now: float) -> float:
        """Returns the TTFT."""
        request.first_token_s = now
        ttft = now - request.arrival_s
        self.ttft[request.index] = ttft
        return ttft

    def finished(self, request: SimRequest, now: float) -> None:
        """The request's last token is now; its decode instance's step times hold the rest."""
        i, k = request.index, request.output_len - 1
        request.finish_s = now
        self.e2e[i] = now - request.arrival_s
        if k:
            times = request.decode.times.window(request.join_step, request.join_step + k)
            gaps = np.diff(times, prepend=request.first_token_s)
            rank = math.ceil(REQUEST_ITL_PERCENTILE / 100 * k) - 1
            self.tpot[i] = (times[-1] - request.first_token_s) / k
            self.itl[i] = float(np.partition(gaps, rank)[rank])
            self.itl_max[i] = float(gaps.max())
            self.gaps.add(gaps)

    def result(self, requests: list[SimRequest], **history) -> SimResult:
        """`history`: the SimResult fields about the cluster (roles, moves, peak_kv_used, ...)."""
        return SimResult(
            arrival_s=np.array([r.arrival_s for r in requests]),
            prompt_len=np.array([r.prompt_len for r in requests]),
            output_len=np.array([r.output_len for r in requests]),
            ttft_s=np.array(self.ttft),
            tpot_s=np.array(self.tpot),
            itl_p90_s=np.array(self.itl),
            itl_max_s=np.array(self.itl_max),
            e2e_s=np.array(self.e2e),
            mode=np.array([int(r.mode) for r in requests]),
            itl_gaps=self.gaps,
            **history,
        )
