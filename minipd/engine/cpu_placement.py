"""Where an engine's compute runs on the CPU: how many torch threads, on which cores.

torch's CPU kernels run on an OpenMP team led by the engine's compute thread (every torch
call of an engine runs on that one thread, see `Engine.run_on_compute_thread`). Left to
torch, the team spans every core, and GNU OpenMP's waiting threads spin for a while after
each parallel region: as soon as anything else wants a core (the engine's own event loop,
a transfer, a router, another instance, an unrelated process), every region waits for a
descheduled thread and a decode step slows down tens of times. So the engine chooses:

- `torch_threads`: the team's size. By default one core of the CPU set is left to the
  event loop and I/O (`cores - 1`, at least 1); None (with the defaults turned off) leaves
  it to torch.
- `cpus`: the cores the compute thread runs on. The OpenMP team inherits the mask when it
  is created; None leaves the thread where the process may run (not pinned).

`apply` runs on the compute thread itself, before it has run any torch op. Whether idle
OpenMP threads spin is fixed when torch loads; see `minipd.entrypoints.openmp_env`.
"""

from __future__ import annotations

import os
import socket

import msgspec
import torch

EVENT_LOOP_CORES = 1  # cores a lone engine leaves to its event loop, transfers and HTTP front


class CpuPlacement(msgspec.Struct, frozen=True):
    torch_threads: int | None  # None: torch's default (every core)
    cpus: tuple[int, ...] | None  # None: not pinned (anywhere the process may run)

    def describe(self) -> str:
        if self.torch_threads is None:
            threads = f"torch's default threads ({torch.get_num_threads()})"
        else:
            threads = f"{self.torch_threads} torch thread{'s' if self.torch_threads != 1 else ''}"
        where = (
            f"pinned to {cpus_text(self.cpus)}"
            if self.cpus is not None
            else f"on {cpus_text(available_cpus())} (not pinned)"
        )
        return f"{threads}, {where}"


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Linux's CPU list syntax (`0-3,6`, as in taskset -c and /sys): sorted, no duplicates.
    Raises ValueError naming the `cpus` field."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"cpus: expected a list such as 0-3,6, got {text!r}")
        lo, hi = int(first), int(last) if sep else int(first)
        if hi < lo:
            raise ValueError(f"cpus: range {part.strip()!r} runs backwards")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: tuple[int, ...]) -> str:
    """The inverse of `parse_cpu_list`: consecutive runs as ranges (`0-3,6`)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def cpus_text(cpus: tuple[int, ...]) -> str:
    """`CPU 3` or `CPUs 0-3,6`, for messages."""
    return f"CPU{'s' if len(cpus) != 1 else ''} {format_cpu_list(cpus)}"


def available_cpus() -> tuple[int, ...]:
    """The cores this thread may run on (its affinity mask, which respects taskset and cgroups)."""
    if not hasattr(os, "sched_getaffinity"):  # not Linux: every core, and no pinning
        return tuple(range(os.cpu_count() or 1))
    return tuple(sorted(os.sched_getaffinity(0)))


def check_cpus(cpus: tuple[int, ...]) -> None:
    """Raises ValueError naming `cpus` unless every one is a core this process may use."""
    allowed = available_cpus()
    outside = tuple(c for c in cpus if c not in allowed)
    if not cpus or outside:
        raise ValueError(
            f"cpus: {format_cpu_list(outside) if outside else 'an empty list'}: not among the CPUs "
            f"this process may use ({format_cpu_list(allowed)})"
        )


def default_torch_threads(num_cpus: int) -> int:
    return max(1, num_cpus - EVENT_LOOP_CORES)


def resolve(torch_threads: int | None, cpus: tuple[int, ...] | None, defaults: bool = True) -> CpuPlacement:
    """The placement for the requested values; a None is filled with the default for the CPU
    set, or left to torch without `defaults`. Raises ValueError naming the field: cores this
    process may not use, or no threads."""
    if cpus is not None:
        check_cpus(cpus)
    if torch_threads is not None and torch_threads <= 0:
        raise ValueError(f"torch_threads: must be positive, got {torch_threads}")
    if torch_threads is None and defaults:
        torch_threads = default_torch_threads(len(cpus if cpus is not None else available_cpus()))
    return CpuPlacement(torch_threads, cpus)


def apply(placement: CpuPlacement) -> None:
    """Pin the calling thread (if asked) and size its OpenMP team. Call it on the compute
    thread before its first torch op: the team is created then and inherits the mask."""
    if placement.cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, placement.cpus)  # 0: the calling thread (Linux)
    if placement.torch_threads is not None:
        torch.set_num_threads(placement.torch_threads)


def compute_key(device: str, placement: CpuPlacement) -> str:
    """What an engine computes on, as `Welcome.compute` says it: host and device, and on the
    CPU the cores its compute thread may run on (its pinning, else the process's CPU set),
    so two engines on the same cores get the same key."""
    host = socket.gethostname()
    if device != "cpu":
        return f"{host}/{device}"
    cpus = placement.cpus if placement.cpus is not None else available_cpus()
    return f"{host}/cpu:{format_cpu_list(cpus)}"


def pin_process(cpus: tuple[int, ...]) -> None:
    """Pin every thread of this process to `cpus` (threads started later inherit it)."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
