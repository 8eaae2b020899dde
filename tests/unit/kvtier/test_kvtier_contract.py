"""The tier's own promises, over stand-in stores that misbehave on cue: bytes in flight bounded
until the store is through with them, nothing written after a fetch returns, a torn store
refused, store failures as misses, a caller's mistakes as ValueError."""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, Sequence

import numpy as np
import pytest
import torch

from minipd.kvtier.backend import Consume, Entry
from minipd.kvtier.block_header import HEADER_BYTES
from minipd.kvtier.fake_backend import FakeBackend
from minipd.kvtier.pool_buffers import block_buffers
from minipd.kvtier.tier import KVTier, TierBlock, TierSettings

MODEL = bytes(range(16))
BLOCK_SIZE, RUN = 16, 4096
TIMEOUT_S = 0.2
SETTINGS = TierSettings(timeout_s=TIMEOUT_S)
WAIT_S = 10.0


def blocks(tier: KVTier, n: int) -> tuple[list[TierBlock], np.ndarray]:
    """`n` blocks of two seeded runs each, and the array they are views of."""
    data = np.random.default_rng(n).integers(0, 256, (n, 2, RUN), dtype=np.uint8)
    keys = tier.keys(list(range(n * BLOCK_SIZE)))
    return [TierBlock(key, list(data[i])) for i, key in enumerate(keys)], data


class HeldBackend(FakeBackend):
    """Stores at once, but says it is through with the buffers only when the test lets it (as a
    Mooncake put that timed out but still runs in its thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Callable[[], None]] = []

    async def put(self, entries: Sequence[Entry], done: Callable[[], None]) -> list[str]:
        self.held.append(done)
        return await super().put(entries, lambda: None)


def test_bytes_in_flight_are_bounded_until_the_store_is_through_with_them():
    async def scenario():
        backend = HeldBackend()
        block_bytes = HEADER_BYTES + 2 * RUN
        tier = KVTier(
            backend, MODEL, BLOCK_SIZE, TierSettings(timeout_s=TIMEOUT_S, max_store_bytes_in_flight=3 * block_bytes)
        )
        five, _ = blocks(tier, 5)
        first = await tier.store(five)
        assert (first.stored, first.skipped) == (3, 2)  # the leading three fit
        assert tier.store_bytes_in_flight == 3 * block_bytes  # the store still holds them
        assert (await tier.store(five[3:4])).skipped == 1
        backend.held.pop()()
        assert tier.store_bytes_in_flight == 0
        assert (await tier.store(five[3:])).stored == 2
        assert tier.stats().stores_skipped == 3

    asyncio.run(scenario())


class LateBackend(FakeBackend):
    """Answers a get never; its thread hands a value to `consume` only when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.thread: threading.Thread | None = None

    async def get(self, keys: Sequence[str], lengths: Sequence[int], consume: Consume) -> list[str | None]:
        value = self.values[keys[0]]

        def late() -> None:
            self.go.wait(WAIT_S)
            consume(0, value)

        self.thread = threading.Thread(target=late)
        self.thread.start()
        await asyncio.Event().wait()  # never answers: the tier times out
        raise AssertionError("unreachable")


def test_nothing_is_written_after_a_fetch_returns():
    async def scenario():
        backend = LateBackend()
        tier = KVTier(backend, MODEL, BLOCK_SIZE, SETTINGS)
        stored, _ = blocks(tier, 1)
        assert (await tier.store(stored)).stored == 1
        dest = np.full((2, RUN), 0xA5, dtype=np.uint8)
        fetched = await tier.fetch([TierBlock(stored[0].key, list(dest))])
        backend.go.set()  # the value arrives after the fetch returned
        await asyncio.to_thread(backend.thread.join, WAIT_S)
        assert not backend.thread.is_alive()
        assert fetched.fetched == [False] and (dest == 0xA5).all()
        assert (tier.stats().timeouts, tier.stats().misses, tier.stats().hits) == (1, 1, 0)

    asyncio.run(scenario())


class TornBackend(FakeBackend):
    """Takes the header at once but reads the payload only when the test lets it: a store call that
    outlived its timeout and read buffers the caller had changed since."""

    def __init__(self) -> None:
        super().__init__()
        self.finish = asyncio.Event()

    async def put(self, entries: Sequence[Entry], done: Callable[[], None]) -> list[str]:
        try:
            await self.finish.wait()
            return await super().put(entries, lambda: None)
        finally:
            done()

    def finish_late(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            self.values[entry.key] = entry.header + b"".join(entry.payload)


def test_a_store_torn_by_changed_buffers_is_refused_when_fetched():
    async def scenario():
        backend = TornBackend()
        tier = KVTier(backend, MODEL, BLOCK_SIZE, SETTINGS)
        to_store, data = blocks(tier, 1)
        seen: list[Entry] = []
        real_put = backend.put

        async def spy(entries, done):
            seen.extend(entries)
            return await real_put(entries, done)

        backend.put = spy
        assert (await tier.store(to_store)).failed == 1  # timed out
        data[0, 1, 7] ^= 0xFF  # the caller reuses the buffers...
        backend.finish_late(seen)  # ... while the abandoned put still reads them
        dest = np.zeros((2, RUN), dtype=np.uint8)
        assert (await tier.fetch([TierBlock(to_store[0].key, list(dest))])).fetched == [False]
        assert tier.stats().verification_failures == 1 and not dest.any()

    asyncio.run(scenario())


class BrokenBackend(FakeBackend):
    async def _reach(self) -> None:
        raise ConnectionRefusedError("nobody home")

    async def register(self, buffer: memoryview) -> None:
        raise ConnectionRefusedError("nobody home")


def test_every_store_failure_is_a_miss_never_an_exception():
    async def scenario():
        tier = KVTier(BrokenBackend(), MODEL, BLOCK_SIZE, SETTINGS)
        to_store, data = blocks(tier, 4)
        assert not await tier.register(data)
        assert (await tier.store(to_store)).failed == 4
        assert await tier.exists([b.key for b in to_store]) == 0
        assert (await tier.fetch(to_store)).fetched == [False] * 4
        assert await tier.remove([b.key for b in to_store]) == 0
        stats = tier.stats()
        assert (stats.errors, stats.stores_failed, stats.misses) == (5, 4, 4)
        assert tier.store_bytes_in_flight == 0
        await tier.close()
        assert (await tier.store(to_store)).skipped == 4 and await tier.exists([to_store[0].key]) == 0

    asyncio.run(scenario())


def test_a_callers_mistake_is_a_value_error():
    async def scenario():
        tier = KVTier(FakeBackend(), MODEL, BLOCK_SIZE)
        key = tier.keys(list(range(BLOCK_SIZE)))[0]
        strided = np.zeros((4, 4), dtype=np.uint8)[:, ::2]
        with pytest.raises(ValueError, match="C-contiguous"):
            await tier.store([TierBlock(key, [strided])])
        with pytest.raises(ValueError, match="writable"):
            await tier.fetch([TierBlock(key, [b"read-only bytes"])])

    asyncio.run(scenario())


def test_a_pools_block_buffers_alias_it():
    pool = torch.zeros((3, 8, 2, BLOCK_SIZE, 2, 8), dtype=torch.bfloat16)
    buffers = block_buffers(pool, 5)
    assert len(buffers) == 3 and all(b.nbytes == pool[0, 5].numel() * 2 for b in buffers)
    buffers[2][:] = b"\x80\x3f" * (buffers[2].nbytes // 2)  # bfloat16 1.0, little-endian
    assert (pool[2, 5] == 1).all() and pool[:2].abs().sum() == 0 and pool[2, 4].abs().sum() == 0
    with pytest.raises(ValueError, match="outside the pool"):
        block_buffers(pool, 8)
