"""A day of traffic whose rate and shape change by the hour, built from `minipd.ops.workload`.

Each hour has a *load* (a fraction of the goodput the cluster would reach on that hour's
shape alone with its best ratio) and a *shape* (prompt and output length
distributions): batch summarisation at night (long prompts, short answers), chat in the
morning, retrieval-augmented answers in the afternoon (long prompts again) and agents in
the evening (long outputs). The right P:D ratio therefore moves through the day, and so
does the total load. Arrivals are Poisson within each hour.

The day is compressed: each hour is simulated for `seconds_per_hour` seconds at that hour's
real request rate, so queueing, batching and latencies are those of the real rates, while
the controller's window and cool-down are scaled to the compressed hour.
"""

from __future__ import annotations

from typing import NamedTuple

from minipd.ops.planner.workload_spec import WorkloadSpec
from minipd.ops.workload import ArrivalProcess, LengthDist, RequestSpec, make_workload


class Shape(NamedTuple):
    name: str
    prompt_len: str  # LengthDist.parse strings
    output_len: str


SUMMARISE = Shape("summarise", "lognormal:4000:0.5:256:16000", "lognormal:150:0.5:16:1024")
CHAT = Shape("chat", "lognormal:600:0.6:32:8000", "lognormal:450:0.6:16:2048")
RAG = Shape("rag", "lognormal:3000:0.5:256:12000", "lognormal:250:0.5:16:1024")
AGENT = Shape("agent", "lognormal:1200:0.5:64:8000", "lognormal:1200:0.5:64:4096")

# (load, shape) per hour, 0:00 to 23:00: quiet nights, busy days, an evening of agents.
HOURS: tuple[tuple[float, Shape], ...] = (
    (0.45, SUMMARISE),
    (0.40, SUMMARISE),
    (0.40, SUMMARISE),
    (0.35, SUMMARISE),
    (0.40, SUMMARISE),
    (0.45, SUMMARISE),
    (0.55, CHAT),
    (0.65, CHAT),
    (0.75, CHAT),
    (0.80, CHAT),
    (0.80, CHAT),
    (0.80, CHAT),
    (0.75, RAG),
    (0.80, RAG),
    (0.80, RAG),
    (0.80, RAG),
    (0.75, RAG),
    (0.75, RAG),
    (0.75, AGENT),
    (0.75, AGENT),
    (0.70, AGENT),
    (0.65, AGENT),
    (0.60, AGENT),
    (0.50, AGENT),
)


OVERDRAW, OVERDRAW_MIN = 1.2, 50


class Hour(NamedTuple):
    start_s: float
    rate_rps: float
    shape: Shape


def day_hours(
    goodput_per_instance: dict[str, float],
    num_instances: int,
    seconds_per_hour: float,
    hours: tuple[tuple[float, Shape], ...] = HOURS,
) -> list[Hour]:
    """The hours with their rates: load x the shape's goodput per instance (as planned for
    that shape alone) x the number of instances."""
    if not seconds_per_hour > 0:
        raise ValueError(f"seconds_per_hour: must be positive, got {seconds_per_hour}")
    return [
        Hour(i * seconds_per_hour, load * goodput_per_instance[shape.name] * num_instances, shape)
        for i, (load, shape) in enumerate(hours)
    ]


def shape_workload(shape: Shape, num_requests: int, seed: int = 0) -> WorkloadSpec:
    return WorkloadSpec(
        name="prefill-heavy",
        prompt_len=shape.prompt_len,
        output_len=shape.output_len,
        num_requests=num_requests,
        seed=seed,
    )


def make_day(hours: list[Hour], seconds_per_hour: float, seed: int = 0) -> list[RequestSpec]:
    """The day's requests, sorted by arrival: each hour's Poisson arrivals cut at its end."""
    specs: list[RequestSpec] = []
    for i, hour in enumerate(hours):
        expected = hour.rate_rps * seconds_per_hour
        # Draw more than the hour can hold (the Poisson count exceeds its mean by 20% + 50 with
        # negligible probability), then keep those inside the hour.
        drawn = make_workload(
            "prefill-heavy",
            int(expected * OVERDRAW + OVERDRAW_MIN),
            ArrivalProcess.poisson(hour.rate_rps),
            seed=seed * 1000 + i,
            prompt_len=LengthDist.parse(hour.shape.prompt_len),
            output_len=LengthDist.parse(hour.shape.output_len),
        )
        specs.extend(s._replace(arrival_s=hour.start_s + s.arrival_s) for s in drawn if s.arrival_s < seconds_per_hour)
    return specs
