"""A key one process writes under its lease and keeps as it wrote it: an instance's record,
a router's.

`write(lease_id)` puts the current value (`value()`) under the lease; the session (session.py)
calls it whenever it granted a lease, `changed()` whenever the value changed (a role switch).
The process watches the key (a `WatchSink` of a watch on it alone, or fed by a wider watch)
and writes it again at once when anyone else changed it (another value, another lease or
none) or deleted it: a record overwritten or deleted by hand, or by a forger, heals within
one round trip to etcd rather than staying wrong for as long as the process lives (its
refreshes keep succeeding, so nothing else would write it again). Events of our own writes
(a mod revision up to our last write's) are not changes. If the key keeps being changed (two
processes under one instance id, fighting over it), the rewrites back off from
`REWRITE_FIRST_S` to a third of the lease's TTL (the refresh period: a key changed all the
time is still as its owner wrote it at least once per refresh), and start again at once
after `REWRITE_QUIET_S` without a change; every rewrite is logged, so the fight shows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from minipd.ops.registry.etcd_client import ETCD_ERRORS, EtcdEndpoints
from minipd.ops.registry.session import LeaseSession
from minipd.ops.registry.watcher import Entry

log = logging.getLogger(__name__)

REWRITE_FIRST_S = 0.1  # the second rewrite within REWRITE_QUIET_S waits this long, the next twice as long...
REWRITE_QUIET_S = 10.0  # a change after this long without one is written back at once


class OwnKey:
    def __init__(self, endpoints: EtcdEndpoints, key: bytes, value: Callable[[], bytes], name: str):
        self.endpoints, self.key, self._value, self.name = endpoints, key, value, name
        self.session: LeaseSession | None = None  # whose lease it lives under (set before the session starts)
        self._written: tuple[bytes, int] | None = None  # value and lease of our last write
        self._revision = 0  # of our last write
        self._dirty = False
        self._task: asyncio.Task | None = None
        self._last_change = -REWRITE_QUIET_S  # monotonic time of the last change by someone else
        self._backoff = 0.0
        self._closed = False
        self.num_rewrites = 0  # after someone else changed or deleted it

    async def write(self, lease_id: int) -> None:
        """Put the current value under `lease_id` (raises ETCD_ERRORS)."""
        value = self._value()
        self._written = (value, lease_id)  # before the put: its event may come before its reply
        reply = await self.endpoints.client.put(self.key, value, lease_id)
        self._revision = max(self._revision, reply.header.revision)

    def changed(self) -> None:
        """The value changed: write it now."""
        self._write_soon(0.0)

    # ---- the watch of the key (watcher.WatchSink) -------------------------------------------
    def snapshot(self, items: list[Entry]) -> None:
        self.seen(next((e for e in items if e.key == self.key), None))

    def put(self, entry: Entry) -> None:
        if entry.key == self.key:
            self.seen(entry)

    def delete(self, key: bytes) -> None:
        if key == self.key:
            self.seen(None)

    def seen(self, entry: Entry | None) -> None:
        """The key as etcd holds it now (None: deleted); written back unless it is ours."""
        if self._closed or self._written is None:
            return  # not written yet: the session's first write comes
        if entry is not None and (entry.mod_revision <= self._revision or (entry.value, entry.lease) == self._written):
            return
        now = time.monotonic()
        quiet = now - self._last_change > REWRITE_QUIET_S
        most = self.session.ttl_s / 3 if self.session is not None else REWRITE_FIRST_S
        self._backoff = 0.0 if quiet else min(max(2 * self._backoff, REWRITE_FIRST_S), most)
        self._last_change = now
        self.num_rewrites += 1
        if entry is None:
            what = "deleted (by someone else, or with an expired lease)"
        else:
            what = f"overwritten by someone else (lease {entry.lease:x})"
        log.warning(
            "%s: %s was %s; writing it again%s",
            self.name,
            self.key.decode("utf-8", "replace"),
            what,
            "" if quiet else f" in {self._backoff:.1f} s (changed again within {REWRITE_QUIET_S:g} s)",
        )
        self._write_soon(self._backoff)

    def _write_soon(self, delay: float) -> None:
        self._dirty = True
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._write_loop(delay))

    async def _write_loop(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)  # backoff while the key keeps being changed by someone else
        while self._dirty and self.session is not None and self.session.lease_id is not None:
            self._dirty = False
            try:
                await self.write(self.session.lease_id)
            except ETCD_ERRORS as exc:
                # the session's refresh loop writes it again once etcd answers (session.py)
                log.warning("%s: writing %s failed: %s", self.name, self.key.decode("utf-8", "replace"), exc)
                self.session.mark_unpublished()
                return

    async def close(self) -> None:
        """Write no more (the session's revocation deletes the key)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
