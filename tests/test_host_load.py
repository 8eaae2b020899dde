"""The foreign-CPU estimate counts the bench's own servers as its own, whatever they do."""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.loadgen.host_load import CLOCK_TICKS, ForeignCpu, _own_ticks, _process_table

BURN_CPU_S = 0.5
BURN = f"import time\nwhile time.process_time() < {BURN_CPU_S}: pass"


def test_cpu_of_children_counts_as_the_bench_own():
    before = _own_ticks(_process_table(), os.getpid())
    subprocess.run([sys.executable, "-c", BURN], check=True, timeout=60)  # reaped: its time moves to us
    after = _own_ticks(_process_table(), os.getpid())
    assert (after - before) / CLOCK_TICKS >= BURN_CPU_S * 0.9


def test_the_share_is_a_fraction_of_the_machine():
    sampler = ForeignCpu()
    subprocess.run([sys.executable, "-c", BURN], check=True, timeout=60)
    share = sampler.share()
    assert sampler.available and 0.0 <= share <= 1.0
