"""How much of the machine other jobs took while a run was measured (Linux /proc).

`ForeignCpu` samples the machine's busy CPU time and that of this process and all its
descendants (the servers the bench started) at the start of a run; `share()` at its end is
the fraction of the machine's capacity (all cores) that went to anything else. On a shared
host this says how far a run's figures can be trusted (0.0 where /proc is missing), and
`QuietGuard` repeats a run that other jobs disturbed too much.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BUSY_FIELDS = slice(0, 8)  # user nice system idle iowait irq softirq steal, minus idle/iowait below
IDLE, IOWAIT = 3, 4


def _machine_busy_ticks() -> int:
    fields = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]][BUSY_FIELDS]
    return sum(fields) - fields[IDLE] - fields[IOWAIT]


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks used so far by it and by its children it has reaped)."""
    table = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            after_name = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        # fields after the name: ppid is 2nd; utime, stime, cutime, cstime are 12th to 15th
        table[int(entry.name)] = (int(after_name[1]), sum(int(v) for v in after_name[11:15]))
    return table


def _own_ticks(table: dict[int, tuple[int, int]], root: int) -> int:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += table.get(pid, (0, 0))[1]
        stack += children.get(pid, [])
    return total


class ForeignCpu:
    def __init__(self) -> None:
        self.available = (PROC / "stat").is_file()
        self._start = self._sample() if self.available else (0, 0, 0.0)

    def _sample(self) -> tuple[int, int, float]:
        return _machine_busy_ticks(), _own_ticks(_process_table(), os.getpid()), time.monotonic()

    def share(self) -> float:
        """Fraction of all cores' time since construction used outside this process tree."""
        if not self.available:
            return 0.0
        busy0, own0, t0 = self._start
        busy1, own1, t1 = self._sample()
        capacity = (t1 - t0) * CLOCK_TICKS * (os.cpu_count() or 1)
        if capacity <= 0:
            return 0.0
        return min(1.0, max(0.0, (busy1 - busy0) - max(0, own1 - own0)) / capacity)  # ticks are coarse


QUIET_WINDOW_S = 10.0  # how long the machine is watched at a time while waiting for quiet


class QuietGuard:
    """Repeats a measurement during which other jobs took more than `max_share` of the machine,
    once they have calmed down (waiting at most `wait_s` each time, at most `max_reruns` times;
    after that the last measurement stands, with its share, for the reader to judge).
    `max_share` None measures once, whatever the machine does."""

    def __init__(self, max_share: float | None = None, wait_s: float = 600.0, max_reruns: int = 3):
        self.max_share, self.wait_s, self.max_reruns = max_share, wait_s, max_reruns

    def measure(self, run: Callable[[], T]) -> tuple[T, float, int]:
        """(what `run` returned, the foreign share during it, how many times it was repeated)."""
        attempt = 0
        while True:
            sampler = ForeignCpu()
            value = run()
            share = sampler.share()
            if not self._repeat(share, attempt):
                return value, share, attempt
            attempt += 1
            self.wait_for_quiet()

    async def measure_async(self, run: Callable[[int], Awaitable[T]]) -> tuple[T, float, int]:
        """`measure` for a coroutine; `run` is given the attempt number (to vary its prompts)."""
        attempt = 0
        while True:
            sampler = ForeignCpu()
            value = await run(attempt)
            share = sampler.share()
            if not self._repeat(share, attempt):
                return value, share, attempt
            attempt += 1
            await asyncio.to_thread(self.wait_for_quiet)

    def _repeat(self, share: float, attempt: int) -> bool:
        if self.max_share is None or share <= self.max_share or attempt == self.max_reruns:
            return False
        print(
            f"minipd-bench: other jobs took {share:.0%} of the machine during that measurement (limit "
            f"{self.max_share:.0%}); repeating it when they calm down",
            file=sys.stderr,
            flush=True,
        )
        return True

    def wait_for_quiet(self) -> bool:
        """Until other jobs use at most `max_share` over a whole window; False if `wait_s` ran out."""
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            sampler = ForeignCpu()
            time.sleep(QUIET_WINDOW_S)  # watching the machine, not synchronising with anything
            if sampler.share() <= self.max_share:
                return True
        return False
