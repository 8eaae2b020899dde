"""A watch on a key prefix that survives etcd errors and restarts.

`start` reads the whole prefix (`WatchSink.snapshot`, every key as an `Entry`: its value,
the lease it was written under, its mod revision) and notes its revision; then a task
watches from the next revision and hands each event to the sink (`put` an Entry, `delete` a
key). When the watch fails (etcd stopped, restarted, or the endpoint became
unreachable) the sink keeps what it knows, and the watch is created again from the revision
after the last one seen, backing off from `RETRY_FIRST_S` to `RETRY_MAX_S`, so no event in
between is missed; if etcd compacted that revision away meanwhile, the prefix is read again
whole (a fresh snapshot) instead.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple, Protocol

from aetcd.rtypes import EventKind

from minipd.ops.registry.etcd_client import ETCD_ERRORS, EtcdEndpoints, RevisionCompacted

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0
START_RETRY_S = 0.2


class Entry(NamedTuple):
    """One key as etcd holds it."""

    key: bytes
    value: bytes
    lease: int  # the lease it was written under; 0: none (it outlives every process)
    mod_revision: int  # of its last write (a delete compared on it removes only that write)

    @classmethod
    def of(cls, kv) -> "Entry":
        return cls(kv.key, kv.value, kv.lease, kv.mod_revision)


class WatchSink(Protocol):
    def snapshot(self, items: list[Entry]) -> None:
        """Every key under the prefix now; keys not listed are gone."""

    def put(self, entry: Entry) -> None: ...

    def delete(self, key: bytes) -> None: ...


class PrefixWatcher:
    def __init__(self, endpoints: EtcdEndpoints, prefix: bytes, sink: WatchSink):
        self.endpoints, self.prefix, self.sink = endpoints, prefix, sink
        self.revision = 0  # the last revision whose events the sink has seen
        self.num_watches = 0  # created so far (one more after each failure)
        self.connected = asyncio.Event()  # set while a watch is established
        self._task: asyncio.Task | None = None

    async def start(self, timeout: float) -> None:
        """Read the prefix, retrying until `timeout` (ConnectionError after it), then watch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await self._snapshot()
                break
            except ETCD_ERRORS as exc:
                if loop.time() + START_RETRY_S > deadline:
                    raise ConnectionError(
                        f"registry: etcd at {self.endpoints.url} unreachable for {timeout:g} s: {exc}"
                    ) from None
                await self.endpoints.failover()
                await asyncio.sleep(START_RETRY_S)  # etcd may still be starting
        self._task = loop.create_task(self._run())

    async def _snapshot(self) -> None:
        result = await self.endpoints.client.get_prefix(self.prefix)
        self.revision = result.header.revision
        self.sink.snapshot([Entry.of(kv) for kv in result])

    async def _run(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            try:
                watch = await self.endpoints.client.watch_prefix(self.prefix, start_revision=self.revision + 1)
                self.num_watches += 1
                self.connected.set()
                if self.num_watches > 1:
                    log.warning("registry: watching %s again from revision %d", self.prefix.decode(), self.revision + 1)
                delay = RETRY_FIRST_S
                async for event in watch:
                    self._dispatch(event)
                raise ConnectionError("the watch ended")
            except RevisionCompacted:
                self.connected.clear()
                log.warning("registry: revision %d was compacted; reading the prefix again", self.revision + 1)
                try:
                    await self._snapshot()
                except ETCD_ERRORS as exc:
                    log.warning("registry: reading the prefix failed (retrying): %s", exc)
                    await asyncio.sleep(delay)  # backoff while etcd does not answer
            except ETCD_ERRORS as exc:
                if self.connected.is_set() or self.num_watches == 0:
                    log.warning("registry: the watch of %s failed, keeping what it saw (retrying): %s",
                                self.prefix.decode(), exc)  # fmt: skip
                self.connected.clear()
                await self.endpoints.failover()
                await asyncio.sleep(delay)  # backoff while etcd does not answer
                delay = min(2 * delay, RETRY_MAX_S)

    def _dispatch(self, event) -> None:
        self.revision = max(self.revision, event.kv.mod_revision)
        if event.kind == EventKind.PUT:
            self.sink.put(Entry.of(event.kv))
        else:
            self.sink.delete(event.kv.key)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.endpoints.close()
