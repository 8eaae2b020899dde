"""The test process as a client on one of the hosts of `NetnsHosts`: an event loop, and a
thread pool for blocking calls, whose threads moved into that host's network namespace.

A network namespace belongs to a thread (setns(2) with CLONE_NEWNET moves only the caller),
and a socket stays in the namespace it was created in: every connection made from these
threads leaves from the client host's address, over the bridge, as a client machine's would,
while the rest of the test process stays where it was. Addresses must be numeric (asyncio
then creates the socket on the loop's thread without a resolver thread).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from loop_thread import DEFAULT_TIMEOUT_S

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def enter_namespace(name: str) -> None:
    """Move the calling thread into the network namespace `name` (`ip netns add name`)."""
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


class NamespaceClient:
    def __init__(self, namespace: str):
        self.loop = asyncio.new_event_loop()
        entered: Future = Future()

        def run() -> None:
            try:
                enter_namespace(namespace)
            except BaseException as exc:
                entered.set_exception(exc)
                return
            entered.set_result(None)
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"client-in-{namespace}", daemon=True)
        self._thread.start()
        try:
            entered.result(DEFAULT_TIMEOUT_S)
        except BaseException:
            self.loop.close()
            raise
        self.pool = ThreadPoolExecutor(
            8, thread_name_prefix="client-call", initializer=enter_namespace, initargs=(namespace,)
        )

    def submit(self, coro: Awaitable[Any]) -> Future:
        """Start `coro` on the loop; its result (or exception) comes on the future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable[Any], timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        return self.submit(coro).result(timeout)

    def call(self, fn: Callable[..., Any], *args, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """Run the blocking `fn(*args)` on a thread in the namespace; its result."""
        return self.pool.submit(fn, *args).result(timeout)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(DEFAULT_TIMEOUT_S)
        self.loop.close()
