"""Progress of the process's UCX worker: one driver task for every waiter, spinning while
requests complete and backing off when they do not, instead of ucxx's own blocking-mode
progress (see `detach_ucxx_progress`)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Callable

from minipd.transports.wakeable_sleep import WakeableSleep

os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
import ucxx  # noqa: E402  (after the environment above is set)

SPIN_S = 2e-3  # a wait spins this long, then sleeps from MIN to MAX seconds between polls
MIN_POLL_S = 50e-6
MAX_POLL_S = 250e-6


def ucx_worker():
    # The worker of ucxx's process-wide context: its tag_send/tag_recv requests can be
    # posted in bulk and awaited together, without one asyncio task per message.
    return ucxx.core._get_ctx().worker


class ProgressDriver:
    """Waits for UCX requests by driving the worker ourselves, with one task for all waiters
    (many layers in flight each spinning their own loop only multiply progress calls).

    It spins (yielding to the loop) while requests keep completing at least every SPIN_S,
    then polls with a sleep that doubles up to the smallest `max_poll_s()` of the waiters (an
    idle cap, above MAX_POLL_S, applies at once); a new waiter or `wake()` restarts the spin.
    The blocking progress mode's epoll wake-ups alone are too coarse here: a wake-up per
    protocol step costs more than the move, and shared-memory arrivals may only be seen at
    its 1 s fallback timer. The back-off keeps a stalled peer from burning a core the other
    process needs."""

    def __init__(self) -> None:
        self._waiters: list[tuple[list, asyncio.Future, Callable[[], float]]] = []
        self._sleep = WakeableSleep()  # the back-off sleep, cut short by a new waiter or wake()
        self._task: asyncio.Task | None = None

    async def wait(self, requests, max_poll_s: Callable[[], float] = lambda: MAX_POLL_S) -> None:
        left = [r for r in requests if not r.completed]
        if left:
            # Requests that completed when posted (a receive matching a message UCX already
            # holds) return at once: queued behind the driver, they would wait out whatever the
            # next progress call does, e.g. the copy of a whole layer.
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            self._waiters.append((left, done, max_poll_s))
            self.wake()
            if self._task is None or self._task.done():
                self._task = loop.create_task(self._drive())
            await done  # cancelling the waiter leaves its requests posted, as before
        for request in requests:
            request.check_error()

    def wake(self) -> None:
        """Cut a back-off sleep short and spin again: a transfer is about to start."""
        self._sleep.wake()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _drive(self) -> None:
        worker = ucx_worker()
        spin_until = time.monotonic() + SPIN_S
        sleep_s = MIN_POLL_S
        while self._waiters:
            worker.progress()
            progressed, still = False, []
            for requests, done, max_poll_s in self._waiters:
                if done.done():  # its waiter was cancelled
                    continue
                left = [r for r in requests if not r.completed]
                progressed = progressed or len(left) < len(requests)
                if left:
                    still.append((left, done, max_poll_s))
                else:
                    done.set_result(None)
            self._waiters = still
            if not still:
                return
            if progressed:
                spin_until = time.monotonic() + SPIN_S
                sleep_s = MIN_POLL_S
            # The peer process does its half of each protocol step (the copy, the reply) only
            # while it runs: when both share a core, yield it instead of spinning out the slice.
            os.sched_yield()
            if time.monotonic() < spin_until:
                await asyncio.sleep(0)
                continue
            cap = min(w[2]() for w in self._waiters)
            # Waiters that expect nothing soon (an idle header receive) poll at their slow pace
            # straight away; `wake` cuts such a sleep short once a transfer is expected.
            pause_s = cap if cap > MAX_POLL_S else min(sleep_s, cap)
            if await self._sleep(pause_s):  # woken: a transfer is likely starting, spin again
                spin_until = time.monotonic() + SPIN_S
                sleep_s = MIN_POLL_S
            else:
                sleep_s = min(cap, sleep_s * 2)


def detach_ucxx_progress(loop: asyncio.AbstractEventLoop) -> None:
    """Undo the blocking-mode progress that ucxx attaches to the loop when it initialises.

    Its reader on the worker's epoll descriptor fires again and again whenever the worker
    cannot be re-armed (level-triggered), which kept an idle instance's loop at ~100% CPU and
    stretched decode steps several-fold. This transport progresses the worker itself (see
    `ProgressDriver`, including the always-posted header receive), so nothing is lost.
    """
    from ucxx._lib_async import application_context

    progress = application_context.ProgressTasks.pop(loop, None)
    if progress is None:
        return
    loop.remove_reader(ucx_worker().epoll_file_descriptor)
    for task in progress._tasks:
        if task is not None:
            task.cancel()
