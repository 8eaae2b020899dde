"""Fit a profile's step-time models to the steps serving instances logged (`--step-log-dir`).

`bench.py profile` times the model runner's steps in a loop inside one process; a serving
instance's steps also carry its event loop (token streams, KV sends and receives, control
calls) and share the machine with the router, the HTTP front and the clients. On a small
machine those move the step times by tens of percent, and only steps measured in the
serving path show it. Each line of a step log (engine/step_log.py) is one whole step: pure
prefill steps (a prefill instance's) give the prefill model, pure decode steps (a decode
instance's) the decode model, each fitted in DistServe's form as `bench.py profile` does;
steps that mix both (colocated instances) are left out, since their cost is not the sum of
the two forms' fixed parts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from minipd.ops.planner.latency_model import DecodeModel, FitStats, PrefillModel, fit_decode_terms, fit_prefill_terms
from minipd.ops.planner.latency_profile import LatencyProfile


class Step(NamedTuple):
    start_s: float
    seconds: float
    q: tuple[int, ...]  # new tokens per prefill chunk
    k: tuple[int, ...]  # tokens each chunk attends to (cached prefix + itself)
    ctx: tuple[int, ...]  # context per decode


def read_steps(path: str | Path, since_s: float = float("-inf")) -> list[Step]:
    """The steps of one log that started at or after `since_s` (the engine's monotonic clock);
    ValueError naming the file and line for a line that is not a step."""
    steps = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                d = json.loads(line)
                step = Step(float(d["t"]), float(d["s"]), tuple(d["q"]), tuple(d["k"]), tuple(d["ctx"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"step log {path}:{number}: not a step ({exc})") from None
            if step.start_s >= since_s:
                steps.append(step)
    return steps


def fit_prefill_steps(steps: Iterable[Step]) -> tuple[PrefillModel, FitStats]:
    pure = [s for s in steps if s.q and not s.ctx]
    return fit_prefill_terms(
        [sum(s.q) for s in pure], [float(sum(q * k for q, k in zip(s.q, s.k))) for s in pure], [s.seconds for s in pure]
    )


def fit_decode_steps(steps: Iterable[Step]) -> tuple[DecodeModel, FitStats]:
    pure = [s for s in steps if s.ctx and not s.q]
    return fit_decode_terms([sum(s.ctx) for s in pure], [len(s.ctx) for s in pure], [s.seconds for s in pure])


def refit(profile: LatencyProfile, prefill_steps: list[Step], decode_steps: list[Step]) -> LatencyProfile:
    """`profile` with its prefill and decode models fitted to serving steps instead (its other
    fields, such as KV capacity and layers, stay); its samples are dropped, as they no longer
    belong to these models."""
    prefill, prefill_fit = fit_prefill_steps(prefill_steps)
    decode, decode_fit = fit_decode_steps(decode_steps)
    return profile.replace(
        name=f"{profile.name}-serving",
        prefill=prefill,
        decode=decode,
        prefill_fit=prefill_fit,
        decode_fit=decode_fit,
        prefill_samples=None,
        decode_samples=None,
        notes=f"{profile.notes}; step models fitted to {len(prefill_steps) + len(decode_steps)} serving steps",
    )
