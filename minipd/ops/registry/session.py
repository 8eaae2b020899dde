"""A lease kept alive: the liveness of one process in the registry.

`start` grants a lease of `ttl_s` seconds and awaits `on_lease(lease_id)`, which puts the
keys that live and die with the process. The lease is then refreshed every `ttl_s / 3`. While
etcd cannot be reached the refreshes fail and are retried at the same pace (etcd, when it
comes back, gives every lease a full TTL again, so keys survive an etcd restart). A lease
that expired meanwhile (the refresh answers TTL 0: this process was unreachable for longer
than the TTL, and every router has dropped it) is replaced by a new one, and `on_lease` is
awaited again, until it succeeds (as it is, under a lease the refresh found alive, after a
put of the keys failed: `mark_unpublished`). `close` revokes the lease: its keys vanish at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from minipd.ops.registry.etcd_client import ETCD_ERRORS, EtcdEndpoints

log = logging.getLogger(__name__)

RETRY_S = 0.2  # between tries to reach etcd at start


class LeaseSession:
    def __init__(self, endpoints: EtcdEndpoints, ttl_s: int, on_lease: Callable[[int], Awaitable[None]], name: str):
        self.endpoints, self.ttl_s, self.name = endpoints, ttl_s, name
        self._on_lease = on_lease
        self.lease_id: int | None = None
        self._published = False  # on_lease succeeded for the current lease
        self._task: asyncio.Task | None = None
        self.num_leases = 0  # granted so far (a new one after each expiry)

    async def start(self, timeout: float) -> None:
        """Grant the first lease and put the keys, retrying until `timeout`; raises the last
        error (etcd unreachable) after it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await self._renew_lease()
                break
            except ETCD_ERRORS as exc:
                if loop.time() + RETRY_S > deadline:
                    raise ConnectionError(
                        f"registry: etcd at {self.endpoints.url} unreachable for {timeout:g} s: {exc}"
                    ) from None
                await self.endpoints.failover()
                await asyncio.sleep(RETRY_S)  # etcd may still be starting
        self._task = loop.create_task(self._keep_alive())

    async def _renew_lease(self) -> None:
        lease = await self.endpoints.client.lease(self.ttl_s)
        self.lease_id, self._published = lease.id, False
        self.num_leases += 1
        await self._on_lease(lease.id)
        self._published = True

    async def _keep_alive(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.ttl_s / 3)  # the refresh period: three tries per TTL
            try:
                reply = await self.endpoints.client.refresh_lease(self.lease_id)
                if reply is None or reply.TTL <= 0:
                    log.warning("%s: registry lease %x expired; taking a new one", self.name, self.lease_id)
                    await self._renew_lease()
                elif not self._published:  # after the refresh: a put under an expired lease never succeeds
                    await self._on_lease(self.lease_id)
                    self._published = True
                if failing:
                    log.warning("%s: registry reachable again", self.name)
                failing = False
            except ETCD_ERRORS as exc:
                if not failing:
                    log.warning("%s: registry lease refresh failed (retrying): %s", self.name, exc)
                failing = True
                await self.endpoints.failover()

    def mark_unpublished(self) -> None:
        """A put of the keys failed: the refresh loop calls `on_lease` again."""
        self._published = False

    async def close(self) -> None:
        """Stop refreshing and revoke the lease (best effort, bounded)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.lease_id is not None:
            try:
                await self.endpoints.client.revoke_lease(self.lease_id)
            except ETCD_ERRORS as exc:
                log.warning("%s: registry lease not revoked (it expires by itself): %s", self.name, exc)
        await self.endpoints.close()
