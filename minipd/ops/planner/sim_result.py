"""What one simulated run produced: per-request latencies and the cluster's history."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minipd.slo.histogram import LogHistogram


class RoleChange(NamedTuple):
    time_s: float
    num_prefill: int  # instances serving as prefill (draining ones excluded)
    num_decode: int
    num_switching: int  # draining or between roles
    num_starting: int = 0  # added, not serving yet (the start-up delay)
    num_removing: int = 0  # draining before they are removed

    @property
    def num_held(self) -> int:
        """Instances the cluster holds (their GPUs are taken) in a P/D cluster."""
        return self.num_prefill + self.num_decode + self.num_switching + self.num_starting + self.num_removing


def held_seconds(roles: list[RoleChange], start_s: float, end_s: float, extra: int = 0) -> float:
    """Instance-seconds held between `start_s` and `end_s` by a cluster whose changes are
    `roles` (in time order; each holds until the next), plus `extra` instances throughout."""
    total = 0.0
    for change, following in zip(roles, [*roles[1:], None]):
        lo = max(start_s, change.time_s)
        hi = min(end_s, following.time_s if following is not None else end_s)
        total += max(0.0, hi - lo) * (change.num_held + extra)
    return total


class SimResult(NamedTuple):
    """Arrays are indexed like the workload's requests. Latencies are seconds; a request with
    a single output token has no gaps (tpot, itl nan). `itl_p90` is the 90th percentile of
    the request's own gaps; `itl_gaps` holds every gap of every request."""

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    itl_p90_s: np.ndarray
    itl_max_s: np.ndarray
    e2e_s: np.ndarray
    mode: np.ndarray  # Mode values
    itl_gaps: LogHistogram
    roles: list[RoleChange]
    moves: list  # controller Decisions that moved an instance
    peak_kv_used: dict[int, int]  # instance index -> most KV tokens reserved at once (decode/colocated)
    kv_capacity: int
    num_admission_waits: int  # requests that found no KV room on arrival
    # Instance-seconds the cluster held from time 0 to the last token, starting, switching and
    # draining instances included (times the profile's GPUs per instance: GPU-seconds).
    instance_seconds: float = 0.0
    scale_events: tuple = ()  # ScaleDecisions that added, removed or switched an instance

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """First arrival to last token."""
        if not self.num_requests:
            return 0.0
        return float(np.max(self.arrival_s + self.e2e_s) - np.min(self.arrival_s))
