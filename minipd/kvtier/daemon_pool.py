"""Worker threads for blocking store calls that may never return.

A store's C++ client blocks in its calls, and against a black-holed server a call can hang for
minutes (a Mooncake setup against a dead master retries for ~90 s). `ThreadPoolExecutor` joins its
workers at interpreter exit, so one such call would hang the process's exit; these workers are
daemon threads, left behind at exit. A call still queued when its future is cancelled (the tier's
timeout) never runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from typing import Any, Callable


class DaemonPool:
    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._pending = 0  # calls submitted and not yet finished (or skipped, cancelled while queued)
        self._idle = threading.Condition()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError("the pool is shut down")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._idle:
            self._pending += 1
        self._queue.put((future, fn, args))
        return future

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no call is queued or running (True), or `timeout_s` passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    async def call(self, fn: Callable[..., Any], *args: Any, done: Callable[[], None] | None = None) -> Any:
        """`fn(*args)` in a worker, awaited. `done()`, if given, is called once the worker is
        through with the call (or it was cancelled before it started, or could not be queued),
        not when the await ends: a timed-out call may read its arguments for a while yet."""
        try:
            future = self.submit(fn, *args)
        except RuntimeError:
            if done is not None:
                done()
            raise
        if done is not None:
            future.add_done_callback(lambda _: done())
        return await asyncio.wrap_future(future)

    def shutdown(self) -> None:
        """Stop the workers once the calls queued so far are done; waits for none of them (one
        stuck in a call stays stuck, a daemon)."""
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            try:
                if future.set_running_or_notify_cancel():
                    _run(future, fn, args)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()


def _run(future: concurrent.futures.Future, fn: Callable[..., Any], args: tuple) -> None:
    try:
        result = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
        future.set_exception(exc)
    else:
        future.set_result(result)
