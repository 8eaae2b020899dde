"""A planner workload: a named `minipd.ops.workload` workload with its lengths and size, whose
arrival rate the planner varies."""

from __future__ import annotations

import functools

import msgspec

from minipd.ops.workload import (
    WORKLOADS,
    ArrivalProcess,
    LengthDist,
    RequestSpec,
    make_workload,
)


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str = "mixed"  # one of minipd.ops.workload.WORKLOADS
    prompt_len: str | None = None  # a LengthDist.parse string; None: the workload's own
    output_len: str | None = None
    num_requests: int = 1000
    seed: int = 0
    burstiness: float = 1.0  # 1: Poisson arrivals; gamma otherwise (vllm bench serve's meaning)

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"workload: unknown {self.name!r}; choose one of {WORKLOADS}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests: must be >= 1, got {self.num_requests}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness: must be positive, got {self.burstiness}")
        for field in ("prompt_len", "output_len"):
            if getattr(self, field) is not None:
                LengthDist.parse(getattr(self, field))  # raises naming the bad text

    def arrivals(self, rate_rps: float) -> ArrivalProcess:
        if self.burstiness == 1.0:
            return ArrivalProcess.poisson(rate_rps)
        return ArrivalProcess.gamma(rate_rps, self.burstiness)

    def make(self, rate_rps: float) -> list[RequestSpec]:
        parse = LengthDist.parse
        return make_workload(
            self.name,
            self.num_requests,
            self.arrivals(rate_rps),
            self.seed,
            prompt_len=parse(self.prompt_len) if self.prompt_len else None,
            output_len=parse(self.output_len) if self.output_len else None,
        )

    def mean_lengths(self) -> tuple[float, float]:
        """Mean prompt and output length, from a draw of the workload itself."""
        return _mean_lengths(self)


@functools.lru_cache(maxsize=256)
def _mean_lengths(spec: WorkloadSpec) -> tuple[float, float]:
    specs = spec.make(1.0)
    return (sum(s.prompt_len for s in specs) / len(specs), sum(s.output_len for s in specs) / len(specs))
