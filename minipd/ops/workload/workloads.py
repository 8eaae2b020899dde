"""The named workloads and `make_workload`, which turns one into a list of `RequestSpec`s.

- `prefill-heavy`: long prompts, short answers (RAG, extraction);
- `decode-heavy`: short prompts, long answers (agents, reasoning);
- `mixed`: both kinds, half and half, interleaved at random;
- `shift`: prefill-heavy for the first half of the requests, decode-heavy for the second
  (the load a P:D ratio controller must follow).
The default lengths suit a small CPU model; every length distribution can be overridden.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from minipd.ops.workload.arrivals import ArrivalProcess, arrival_times
from minipd.ops.workload.lengths import LengthDist
from minipd.ops.workload.request_spec import RequestSpec


class WorkloadShape(NamedTuple):
    prompt_len: LengthDist
    output_len: LengthDist


PREFILL_HEAVY = WorkloadShape(LengthDist.uniform(512, 1024), LengthDist.uniform(8, 32))
DECODE_HEAVY = WorkloadShape(LengthDist.uniform(16, 64), LengthDist.uniform(128, 256))

WORKLOADS = ("prefill-heavy", "decode-heavy", "mixed", "shift")


def _shapes(
    name: str, prompt_len: LengthDist | None, output_len: LengthDist | None
) -> tuple[WorkloadShape, WorkloadShape]:
    """(shape of a prefill-heavy request, shape of a decode-heavy one) with the overrides applied."""

    def override(shape: WorkloadShape) -> WorkloadShape:
        return WorkloadShape(prompt_len or shape.prompt_len, output_len or shape.output_len)

    if name == "prefill-heavy":
        return override(PREFILL_HEAVY), override(PREFILL_HEAVY)
    if name == "decode-heavy":
        return override(DECODE_HEAVY), override(DECODE_HEAVY)
    if name in ("mixed", "shift"):
        if prompt_len or output_len:
            raise ValueError(
                f"workload {name!r} mixes two shapes; override its lengths by running "
                "prefill-heavy and decode-heavy separately"
            )
        return PREFILL_HEAVY, DECODE_HEAVY
    raise ValueError(f"workload: unknown {name!r}; choose one of {WORKLOADS}")


def make_workload(
    name: str,
    num_requests: int,
    arrivals: ArrivalProcess,
    seed: int = 0,
    prompt_len: LengthDist | None = None,
    output_len: LengthDist | None = None,
) -> list[RequestSpec]:
    """`num_requests` requests of workload `name`, arriving by `arrivals`; a pure function of its
    arguments (the same seed gives the same list)."""
    if num_requests < 0:
        raise ValueError(f"num_requests: must be >= 0, got {num_requests}")
    heavy, light = _shapes(name, prompt_len, output_len)
    rng = random.Random(seed)
    times = arrival_times(arrivals, num_requests, rng)
    specs = []
    for i, t in enumerate(times):
        if name == "shift":
            shape = heavy if i < num_requests // 2 else light
        elif name == "mixed":
            shape = heavy if rng.random() < 0.5 else light
        else:
            shape = heavy
        specs.append(RequestSpec(t, shape.prompt_len.sample(rng), shape.output_len.sample(rng)))
    return specs
