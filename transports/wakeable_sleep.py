"""A sleep that can be cut short: how the polling backends (UCX, NIXL) pace their polls yet
react at once when a transfer becomes expected."""

from __future__ import annotations

import asyncio


class WakeableSleep:
    """`await sleep(seconds)` returns False when the time ran out, True when `wake()` ended it
    first. `current` is the future of the sleep in progress, None between sleeps. One sleeper
    at a time; `wake()` with nobody asleep does nothing."""

    def __init__(self) -> None:
        self.current: asyncio.Future | None = None

    async def __call__(self, seconds: float) -> bool:
        loop = asyncio.get_running_loop()
        future = self.current = loop.create_future()
        timer = loop.call_later(seconds, _resolve, future, False)
        try:
            return await future
        finally:
            timer.cancel()
            if self.current is future:
                self.current = None

    def wake(self) -> None:
        if self.current is not None:
            _resolve(self.current, True)


def _resolve(future: asyncio.Future, value: bool) -> None:
    if not future.done():
        future.set_result(value)
