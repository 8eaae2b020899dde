"""Arrival processes: Poisson at a rate, gamma with a burstiness factor, or fixed concurrency.

Burstiness follows `vllm bench serve`: inter-arrival gaps are gamma-distributed with shape
`burstiness` and mean 1/rate, so 1.0 is Poisson, below 1 is burstier and above 1 is more
regular. A fixed-concurrency run has no arrival times: every request is due at 0 and the
client keeps `concurrency` of them in flight.
"""

from __future__ import annotations

import math
import random

import msgspec

KINDS = ("poisson", "gamma", "concurrency")


class ArrivalProcess(msgspec.Struct, frozen=True):
    kind: str = "poisson"
    rate: float = 1.0  # requests per second (poisson, gamma)
    burstiness: float = 1.0  # gamma shape (gamma)
    concurrency: int = 1  # requests in flight (concurrency)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"arrivals: unknown kind {self.kind!r}; choose one of {KINDS}")
        if self.kind != "concurrency" and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"arrivals: rate must be a positive number, got {self.rate}")
        if self.kind == "gamma" and not self.burstiness > 0:
            raise ValueError(f"arrivals: burstiness must be positive, got {self.burstiness}")
        if self.kind == "concurrency" and self.concurrency < 1:
            raise ValueError(f"arrivals: concurrency must be >= 1, got {self.concurrency}")

    @classmethod
    def poisson(cls, rate: float) -> "ArrivalProcess":
        return cls("poisson", rate=rate)

    @classmethod
    def gamma(cls, rate: float, burstiness: float) -> "ArrivalProcess":
        return cls("gamma", rate=rate, burstiness=burstiness)

    @classmethod
    def fixed_concurrency(cls, concurrency: int) -> "ArrivalProcess":
        return cls("concurrency", concurrency=concurrency)

    def with_rate(self, rate: float) -> "ArrivalProcess":
        return msgspec.structs.replace(self, rate=rate)


def arrival_times(process: ArrivalProcess, num_requests: int, rng: random.Random) -> list[float]:
    """Arrival offsets in seconds, non-decreasing, the first one after the first gap."""
    if process.kind == "concurrency":
        return [0.0] * num_requests
    times, t = [], 0.0
    for _ in range(num_requests):
        if process.kind == "poisson":
            t += rng.expovariate(process.rate)
        else:
            t += rng.gammavariate(process.burstiness, 1.0 / (process.rate * process.burstiness))
        times.append(t)
    return times
