"""Mooncake Store as the tier's store (`mooncake://MASTER_HOST:PORT`), through its Python client
(`mooncake.store.MooncakeDistributedStore`, a synchronous C++ client).

Every call runs in a worker thread (`DaemonPool`), so the event loop never blocks; a call that
outlives the tier's timeout is abandoned there. Blocks move with `batch_put_from_multi_buffers`
and `batch_get_into_multi_buffers`, one key to a block and one buffer to each of its runs, so a
block of a layer-major pool leaves straight from the pool once the pool is registered
(`register`); headers, blocks from unregistered memory and every fetched value pass through a
registered staging arena (`staging.StagingArena` says why fetches must).

Around the client's known behaviours:
- `is_exist` renews the key's lease, which holds off eviction: a leading lookup asks in growing
  chunks and stops at the first missing key, so it renews no lease past the prefix it can use
  (and the local master is started with short leases: `mooncake_master.py`).
- a get racing an eviction fails with LEASE_EXPIRED: a miss, as a missing key is.
- batch puts are not retried by the client, nor here: a failed block is counted, and the next
  request that computes it stores it again.
- a plain remove fails while a lease is held (after any lookup or get): removals are forced.
- closing the client while another thread is inside one of its calls crashes the process (seen:
  a get that outlived its timeout): `close` waits until no call runs, or leaves the client open.
- setup against a dead master retries for ~90 s: `open` bounds it and leaves it to its thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from minipd.kvtier.backend import ABSENT, ERROR, FAILED, SKIPPED, STORED, WRONG_LENGTH, Consume, Entry, TierBackend
from minipd.kvtier.daemon_pool import DaemonPool
from minipd.kvtier.staging import Allocation, StagingArena

WORKERS = 4
IDLE_WAIT_S = 10.0  # how long close waits for calls still running in the workers
FIRST_LOOKUP_CHUNK = 8
# The client's error codes this backend tells apart (mooncake-store's ErrorCode).
BUFFER_OVERFLOW = -600  # the value is longer than the buffers given
OBJECT_NOT_FOUND = -704
LEASE_EXPIRED = -707  # the value was evicted while being read
TRANSFER_FAIL = -800  # among others: the value is shorter than the buffers given


class MooncakeError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class MooncakeSettings:
    """What `setup` needs (`open_tier` builds it from the URL)."""

    master: str  # HOST:PORT of the master's RPC service
    metadata: str  # the HTTP metadata server's URL (the local master serves it itself)
    local_hostname: str  # the address other clients reach this one's segment at
    segment_bytes: int  # memory this client contributes to the store
    local_buffer_bytes: int  # the client's own buffer, for its copying calls (`put`, `get`)
    staging_bytes: int  # the registered staging arena (fetches pass through it in rounds)
    protocol: str = "tcp"
    rdma_devices: str = ""


class MooncakeBackend(TierBackend):
    name = "mooncake"

    def __init__(self, client: Any, staging: StagingArena, threads: DaemonPool) -> None:
        """Use `open`; `client` is a set-up `MooncakeDistributedStore` with `staging` registered."""
        self.client = client  # public for tools and tests that reach the store directly
        self._staging, self._threads = staging, threads
        self._regions: list[tuple[int, int]] = [(staging.address, staging.address + staging.nbytes)]

    @classmethod
    async def open(cls, settings: MooncakeSettings, timeout_s: float) -> MooncakeBackend:
        """Set up a client within `timeout_s` (against a dead master, setup itself retries for
        ~90 s); MooncakeError if it cannot."""
        from mooncake.store import MooncakeDistributedStore

        threads = DaemonPool(WORKERS, "kvtier-mooncake")
        client = MooncakeDistributedStore()
        staging = StagingArena(settings.staging_bytes)

        def setup() -> None:
            code = client.setup(
                settings.local_hostname,
                settings.metadata,
                settings.segment_bytes,
                settings.local_buffer_bytes,
                settings.protocol,
                settings.rdma_devices,
                settings.master,
            )
            if code != 0:
                raise MooncakeError(f"setup against master {settings.master} failed ({code})")
            code = client.register_buffer(staging.address, staging.nbytes)
            if code != 0:
                raise MooncakeError(f"registering the staging arena failed ({code})")

        try:
            await asyncio.wait_for(threads.call(setup), timeout_s)
        except BaseException as exc:
            threads.shutdown()  # a setup still running is left to its daemon thread
            if isinstance(exc, asyncio.TimeoutError):
                raise MooncakeError(
                    f"no Mooncake master answered at {settings.master} within {timeout_s:g} s"
                ) from None
            raise
        return cls(client, staging, threads)

    async def register(self, buffer: memoryview) -> None:
        start = _address(buffer)

        def register() -> None:
            code = self.client.register_buffer(start, buffer.nbytes)
            if code != 0:
                raise MooncakeError(f"register_buffer failed ({code})")

        await self._threads.call(register)
        self._regions.append((start, start + buffer.nbytes))

    async def exists(self, keys: Sequence[str], leading: bool) -> list[bool]:
        return await self._threads.call(self._exists, list(keys), leading)

    def _exists(self, keys: list[str], leading: bool) -> list[bool]:
        found = [False] * len(keys)
        start, chunk = 0, len(keys) if not leading else FIRST_LOOKUP_CHUNK
        while start < len(keys):
            codes = self.client.batch_is_exist(keys[start : start + chunk])
            # Every key failing is the store failing; one key failing (say, a value another client
            # is still putting) is that key not being there yet.
            if codes and all(code < 0 for code in codes):
                raise MooncakeError(f"batch_is_exist failed ({min(codes)})")
            for i, code in enumerate(codes):
                found[start + i] = code == 1
            if leading and not all(code == 1 for code in codes):
                break  # asking on would renew leases on keys past the usable prefix
            start, chunk = start + chunk, chunk * 2
        return found

    async def put(self, entries: Sequence[Entry], done: Callable[[], None]) -> list[str]:
        return await self._threads.call(self._put, list(entries), done=done)

    def _put(self, entries: list[Entry]) -> list[str]:
        outcomes, taken = [SKIPPED] * len(entries), []
        try:
            keys, pointers, sizes, indices = [], [], [], []
            for i, entry in enumerate(entries):
                buffers = self._place(entry, taken)
                if buffers is None:
                    continue  # no staging room: skipped, as a store over the bytes bound is
                keys.append(entry.key)
                pointers.append([address for address, _ in buffers])
                sizes.append([size for _, size in buffers])
                indices.append(i)
            if keys:
                codes = self.client.batch_put_from_multi_buffers(keys, pointers, sizes)
                for i, code in zip(indices, codes):
                    outcomes[i] = STORED if code == 0 else FAILED
            return outcomes
        finally:
            for allocation in taken:
                self._staging.free(allocation)

    def _place(self, entry: Entry, taken: list[Allocation]) -> list[tuple[int, int]] | None:
        """(address, size) of each registered buffer the entry's value goes out from: its header
        in staging, then its payload where it is if registered, else copied into staging."""
        direct = all(self._registered(buffer) for buffer in entry.payload)
        allocation = self._staging.alloc(len(entry.header) if direct else entry.nbytes)
        if allocation is None:
            return None
        taken.append(allocation)
        view = self._staging.view(allocation)
        view[: len(entry.header)] = entry.header
        if direct:
            return [(self._staging.address + allocation.offset, len(entry.header))] + [
                (_address(buffer), buffer.nbytes) for buffer in entry.payload
            ]
        offset = len(entry.header)
        for buffer in entry.payload:
            view[offset : offset + buffer.nbytes] = buffer
            offset += buffer.nbytes
        return [(self._staging.address + allocation.offset, entry.nbytes)]

    def _registered(self, buffer: memoryview) -> bool:
        start = _address(buffer)
        return any(low <= start and start + buffer.nbytes <= high for low, high in self._regions)

    async def get(self, keys: Sequence[str], lengths: Sequence[int], consume: Consume) -> list[str | None]:
        return await self._threads.call(self._get, list(keys), list(lengths), consume)

    def _get(self, keys: list[str], lengths: list[int], consume: Consume) -> list[str | None]:
        """In rounds: as many keys as staging has room for, fetched, handed to `consume` and the
        room freed; a round with no room at all ends the fetch (the rest are errors)."""
        statuses: list[str | None] = [ERROR] * len(keys)
        start = 0
        while start < len(keys):
            taken: list[Allocation] = []
            while start + len(taken) < len(keys):
                allocation = self._staging.alloc(lengths[start + len(taken)])
                if allocation is None:
                    break
                taken.append(allocation)
            if not taken:
                break
            try:
                stop = start + len(taken)
                pointers = [[self._staging.address + a.offset] for a in taken]
                codes = self.client.batch_get_into_multi_buffers(
                    keys[start:stop], pointers, [[n] for n in lengths[start:stop]]
                )
                for i, (allocation, code) in enumerate(zip(taken, codes), start):
                    if code == lengths[i]:
                        consume(i, self._staging.view(allocation))
                        statuses[i] = None
                    else:
                        statuses[i] = self._why_not(keys[i], lengths[i], code)
            finally:
                for allocation in taken:
                    self._staging.free(allocation)
            start = stop
        return statuses

    def _why_not(self, key: str, length: int, code: int) -> str:
        if code in (OBJECT_NOT_FOUND, LEASE_EXPIRED):
            return ABSENT
        if code >= 0 or code in (BUFFER_OVERFLOW, TRANSFER_FAIL):
            size = self.client.get_size(key)  # only on this path: is it a value of another length?
            return WRONG_LENGTH if size >= 0 and size != length else ERROR
        return ERROR

    async def remove(self, keys: Sequence[str]) -> int:
        # Forced: a lookup or get holds the key's lease a while, and a plain remove fails under it.
        codes = await self._threads.call(self.client.batch_remove, list(keys), True)
        return sum(code == 0 for code in codes)

    async def close(self) -> None:
        # Closing while a worker is inside a call crashes the process: only once none is, else never.
        if not await asyncio.to_thread(self._threads.wait_idle, IDLE_WAIT_S):
            self._threads.shutdown()
            raise MooncakeError(f"calls still running after {IDLE_WAIT_S:g} s: the client is left open")

        def close() -> None:
            for start, _ in self._regions:
                self.client.unregister_buffer(start)
            self.client.close()

        try:
            await self._threads.call(close)
        finally:
            self._threads.shutdown()


def _address(buffer: memoryview) -> int:
    """The address of a buffer's first byte (numpy reads it from read-only buffers too)."""
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)
