"""Waiting for the signal that stops a long-running role, and the launcher's signals.

A role (`wait_for_stop_signal`) stops gracefully on its first SIGINT or SIGTERM; its handlers
are then removed, so a second one ends it at once. The launcher (`LauncherSignals`) keeps
its handlers until it has stopped every child: the first signal starts the graceful stop,
and every later one escalates (its children are killed at once) instead of killing the
launcher mid-shutdown, which would leave them running.

`StopDeadline` is a role's one deadline for its whole stop: `--shutdown-timeout-s` after
the signal, each step of the stop getting what is left of it. `settle_heap`, called once a
process serves, keeps its exit short once the stop is done.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def wait_for_stop_signal() -> None:
    """Return once SIGINT or SIGTERM arrives (Ctrl-C, or a launcher stopping its children)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


class LauncherSignals:
    """SIGINT and SIGTERM for a launcher's whole run (a context manager): the first sets
    `stop` and calls `stopping`, each one after it calls `escalate`."""

    def __init__(self, stopping: Callable[[], None], escalate: Callable[[], None]) -> None:
        self.stop = asyncio.Event()
        self.count = 0
        self._stopping, self._escalate = stopping, escalate

    def _on_signal(self) -> None:
        self.count += 1
        if self.count == 1:
            self.stop.set()
            self._stopping()
        else:
            self._escalate()

    def __enter__(self) -> "LauncherSignals":
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


class StopDeadline:
    """`bound_s` from `start()` (the stop signal); before it, a step gets the whole bound (a
    role that fails while starting stops within it too)."""

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self._ends_at: float | None = None

    def start(self) -> None:
        self._ends_at = time.monotonic() + self.bound_s

    def left_s(self) -> float:
        """Seconds until the deadline, never below 0."""
        if self._ends_at is None:
            return self.bound_s
        return max(0.0, self._ends_at - time.monotonic())


def settle_heap() -> None:
    """Once a process serves: collect what its start left over, then move every object alive
    to the garbage collector's permanent generation (`gc.freeze`), which it never walks
    again, neither in a full collection while serving nor at exit. The interpreter's last
    collections walked the model's and the libraries' objects: about 0.9 s of CPU, 3 to 5 s
    for a launcher's child on two busy cores, after its stop had ended (frozen: under 1 s).
    Objects made from now on are collected as ever."""
    gc.collect()
    gc.freeze()
