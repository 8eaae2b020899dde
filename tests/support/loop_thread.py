"""An event loop on a background thread, so synchronous tests can drive async code with timeouts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable

DEFAULT_TIMEOUT_S = 60.0


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[Any], timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """Run `coro` on the loop and wait for its result, failing after `timeout` seconds."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=DEFAULT_TIMEOUT_S)
        self.loop.close()
