"""An engine's memory stays bounded whatever mix of prompt lengths arrives, in the machine's
default dtype (bfloat16 where matmuls are native: torch's kernels are built and cached per
input shape, see minipd/engine/kernel_caches.py and models/arch/paged_attention.py).

Each measure runs in a process of its own (tests/support/engine_rss_workload.py), which reads
its resident set from /proc/self/status as it serves what an instance under load sees: prompts
of random lengths up to ~900 tokens, six at a time, so that prefill steps of every size meet.
Bounded means the growth stops: after the first third of the requests (the kernels of the
common shapes built, the allocator's arenas grown), the rest must add little. Where the
default dtype is bfloat16, the same workload with the caches at torch's default capacity shows
the growth the bound prevents: the measure sees it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minipd.engine import kernel_caches

SUPPORT = Path(__file__).resolve().parents[1] / "support"
NUM_REQUESTS, CONCURRENCY, MAX_PROMPT_LEN, NUM_MARKS = 360, 6, 900, 6
# Measured on an AVX-512 EPYC (bf16 native, no AMX), tiny, these 360 requests: bounded, the
# last two thirds added 0-3 MB (326 -> 329 MB); at torch's default capacity ~110 MB (400 -> 511).
# Allocator noise is a few MB; a cache that keeps a kernel per new shape adds tens.
MAX_LATE_GROWTH_MB = 25.0
MIN_UNBOUNDED_LATE_GROWTH_MB = 3 * MAX_LATE_GROWTH_MB
TORCH_DEFAULT_CAPACITY = "1024"
RUN_TIMEOUT_S = 300


def _serve(capacity_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in kernel_caches.CAPACITY_ENV} | capacity_env
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), env.get("PYTHONPATH")]))
    argv = [str(n) for n in (NUM_REQUESTS, CONCURRENCY, MAX_PROMPT_LEN, NUM_MARKS)]
    run = subprocess.run(
        [sys.executable, str(SUPPORT / "engine_rss_workload.py"), "tiny", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert len(result["rss_marks_mb"]) == NUM_MARKS, result
    return result


def _late_growth(result: dict) -> float:
    """Growth over the last two thirds of the requests (from the mark after the first third)."""
    marks = result["rss_marks_mb"]
    return marks[-1] - marks[NUM_MARKS // 3 - 1]


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_rss_stops_growing_under_random_prompt_lengths_in_the_default_dtype():
    bounded = _serve({})  # the engine bounds the caches itself
    assert _late_growth(bounded) < MAX_LATE_GROWTH_MB, (
        f"{bounded['dtype']}: RSS still grew {_late_growth(bounded):.0f} MB over the last two thirds of "
        f"{NUM_REQUESTS} requests: {bounded['rss_start_mb']:.0f} -> {[round(m) for m in bounded['rss_marks_mb']]} MB"
    )
    if bounded["dtype"] != "bfloat16":
        return  # float32 builds no per-shape kernels: nothing to bound, and no unbounded growth to show
    unbounded = _serve({name: TORCH_DEFAULT_CAPACITY for name in kernel_caches.CAPACITY_ENV})
    assert _late_growth(unbounded) > MIN_UNBOUNDED_LATE_GROWTH_MB, (
        f"the unbounded caches grew only {_late_growth(unbounded):.0f} MB: the measure sees no growth "
        f"({[round(m) for m in unbounded['rss_marks_mb']]} MB)"
    )
