"""An in-process store for unit tests, never a default: a dict, and switches that make it act as a
store that is down (`down`: every call raises) or black-holed (`frozen`: every call hangs until
thawed), so the tier's contract can be checked without a server. `open_kv_tier` opens it only
for the `fake://` URL, which nothing but the tests uses."""

from __future__ import annotations

import asyncio
from typing import Callable, Sequence

from minipd.kvtier.backend import PRESENT, STORED, Consume, Entry, TierBackend, consume_in_thread


class FakeStoreDown(ConnectionError):
    pass


class FakeBackend(TierBackend):
    name = "fake"

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}  # the raw store, for tests to read and corrupt
        self.down = False
        self._thawed: asyncio.Event | None = None  # made by freeze(), on the loop that waits on it

    def freeze(self) -> None:
        """Every call from now hangs until `thaw()`."""
        self._thawed = asyncio.Event()

    def thaw(self) -> None:
        if self._thawed is not None:
            self._thawed.set()
            self._thawed = None

    async def _reach(self) -> None:
        if self._thawed is not None:
            await self._thawed.wait()
        if self.down:
            raise FakeStoreDown("the fake store is down")

    async def exists(self, keys: Sequence[str], leading: bool) -> list[bool]:
        await self._reach()
        return [key in self.values for key in keys]

    async def put(self, entries: Sequence[Entry], done: Callable[[], None]) -> list[str]:
        try:
            await self._reach()
            outcomes = []
            for entry in entries:
                if entry.key in self.values:
                    outcomes.append(PRESENT)
                else:
                    self.values[entry.key] = entry.header + b"".join(entry.payload)
                    outcomes.append(STORED)
            return outcomes
        finally:
            done()

    async def get(self, keys: Sequence[str], lengths: Sequence[int], consume: Consume) -> list[str | None]:
        await self._reach()
        values = [self.values.get(key) for key in keys]
        return await consume_in_thread(values, consume)

    async def remove(self, keys: Sequence[str]) -> int:
        await self._reach()
        return sum(self.values.pop(key, None) is not None for key in keys)

    async def close(self) -> None:
        pass  # the values stay: several tiers may share one fake store, as they share a real one
