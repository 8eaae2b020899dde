"""Deleting keys a router will not act on (a claim or a record bound to no live lease of its
writer): each only as the router saw it.

`delete(entry, why)` runs one transaction that deletes `entry.key` only if its mod revision is
still `entry.mod_revision`, so a valid write made since (a real claim, an instance writing
its record back) stays. It is retried, backing off from `RETRY_FIRST_S` to `RETRY_MAX_S`,
while etcd does not answer or refuses (a user without write access to the prefix: logged
once), until `close`. Several routers deleting the same key is harmless: the first
transaction deletes it, the others find it changed and do nothing.
"""

from __future__ import annotations

import asyncio
import logging

from minipd.ops.registry.etcd_client import ETCD_ERRORS, EtcdEndpoints
from minipd.ops.registry.watcher import Entry

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0


class KeyCleanup:
    def __init__(self, endpoints: EtcdEndpoints, name: str):
        self.endpoints, self.name = endpoints, name
        self._pending: dict[tuple[bytes, int], asyncio.Task] = {}
        self.num_deleted = 0  # transactions that found the key as seen and deleted it

    def delete(self, entry: Entry, why: str) -> None:
        """Delete `entry.key` if it still is that write; `why` goes to the log."""
        seen = (entry.key, entry.mod_revision)
        if seen not in self._pending:
            task = asyncio.get_running_loop().create_task(self._delete(entry, why))
            self._pending[seen] = task
            task.add_done_callback(lambda _: self._pending.pop(seen, None))

    async def _delete(self, entry: Entry, why: str) -> None:
        key, delay, tries = entry.key.decode("utf-8", "replace"), RETRY_FIRST_S, 0
        while True:
            try:
                client = self.endpoints.client
                deleted, _ = await client.transaction(
                    compare=[client.transactions.mod(entry.key) == entry.mod_revision],
                    success=[client.transactions.delete(entry.key)],
                    failure=[],
                )
                if deleted:
                    self.num_deleted += 1
                    log.warning("%s: deleted %s (revision %d): %s", self.name, key, entry.mod_revision, why)
                return
            except ETCD_ERRORS as exc:
                tries += 1
                level = logging.WARNING if tries == 1 else logging.DEBUG
                log.log(level, "%s: deleting %s failed (retrying): %s", self.name, key, exc)
                await asyncio.sleep(delay)  # backoff while etcd does not answer or refuses
                delay = min(2 * delay, RETRY_MAX_S)

    async def close(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
        await asyncio.gather(*self._pending.values(), return_exceptions=True)
