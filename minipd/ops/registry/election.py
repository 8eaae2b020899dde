"""One ratio controller among several routers: a leader elected through a lease-guarded key.

Every router started with `--ratio-controller` and `--registry` campaigns: it grants a lease
of its own (`ttl_s`) and runs one transaction that puts `P/controller/leader` (value: the
router's name) under that lease only if the key does not exist (its create revision is 0).
Exactly one campaigner wins; it calls `on_elected` (the router starts its controller). The
others watch the key and campaign again once it is deleted (the leader shut down and revoked
its lease, or its lease expired: it died or was cut off for longer than the TTL), and at the
latest every `ttl_s` (a watch event missed while etcd was unreachable). Each campaign takes
a fresh lease; a lost one's is revoked.

A campaign's key is always under a lease: one without a lease, or one naming this router
while it does not lead, was written by someone else (a person, a forger) and would keep every
router from leading; a campaigner that reads one deletes it (only as it read it) and campaigns
again.

The leader refreshes its lease every `ttl_s / REFRESHES_PER_TTL` and checks the key is still
its own. `leader` is true only while the last successful refresh *began* less than
`ttl_s * DEPOSED_AFTER` ago: the lease, refreshed then, lasts at least until `ttl_s` after
that moment, so the router stops deciding moves (the controller guards each decision with
`leader`, and `on_deposed` stops it) while its lease still holds the key and before another
router can be elected. This holds even for a process frozen (SIGSTOP) and resumed: the test
reads the monotonic clock, which ran on meanwhile. A deposed router revokes its old lease
(best effort) and campaigns again with a new one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from minipd.ops.registry.etcd_client import ETCD_ERRORS, EtcdEndpoints

log = logging.getLogger(__name__)

REFRESHES_PER_TTL = 6
DEPOSED_AFTER = 0.5  # of the TTL since the last refresh that succeeded
RETRY_S = 0.2  # between campaigns while etcd does not answer


def leader_key(prefix: str) -> bytes:
    return f"{prefix}/controller/leader".encode()


class ControllerElection:
    def __init__(
        self,
        endpoints: EtcdEndpoints,
        prefix: str,
        ttl_s: int,
        name: str,
        on_elected: Callable[[], None],
        on_deposed: Callable[[], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.endpoints, self.ttl_s, self.name = endpoints, ttl_s, name
        self.key = leader_key(prefix)
        self._on_elected, self._on_deposed, self.clock = on_elected, on_deposed, clock
        self.leader_id: str | None = None  # who holds the key, as last read
        self.num_elected = 0  # times this router won
        self._lease_id: int | None = None
        self._elected_at: float | None = None  # start of the last refresh that succeeded, while leader
        self._task: asyncio.Task | None = None

    @property
    def leader(self) -> bool:
        """True while this router holds the key and its lease surely still holds it."""
        at = self._elected_at
        return at is not None and self.clock() - at < self.ttl_s * DEPOSED_AFTER

    def start(self) -> None:
        """Campaign, on the router's event loop, until `close`."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                if await self._campaign():
                    await self._lead()
                else:
                    await self._wait_for_vacancy()
            except ETCD_ERRORS as exc:
                log.warning("%s: controller election: etcd unreachable (retrying): %s", self.name, exc)
                await self.endpoints.failover()
                await asyncio.sleep(RETRY_S)  # backoff while etcd does not answer
            finally:
                if self._elected_at is not None:
                    await self._step_down()

    async def _campaign(self) -> bool:
        client = self.endpoints.client
        started = self.clock()
        lease = (await client.lease(self.ttl_s)).id  # a fresh one: a loser's is not refreshed
        try:
            won, _ = await client.transaction(
                compare=[client.transactions.create(self.key) == 0],
                success=[client.transactions.put(self.key, self.name.encode(), lease=lease)],
                failure=[],
            )
        finally:
            self._lease_id = lease
        if not won:
            await self._revoke()
        else:
            self._elected_at, self.leader_id = started, self.name
            self.num_elected += 1
            log.warning("%s: elected to run the ratio controller", self.name)
            self._on_elected()
        return won

    async def _lead(self) -> None:
        """Refresh the lease until a refresh fails to come in time or the key is not ours."""
        client = self.endpoints.client
        while True:
            await asyncio.sleep(self.ttl_s / REFRESHES_PER_TTL)  # the refresh period
            if not self.leader:
                log.warning("%s: no lease refresh for %.1f s: deposed", self.name, self.ttl_s * DEPOSED_AFTER)
                return
            started = self.clock()
            remaining = self.ttl_s * DEPOSED_AFTER - (started - self._elected_at)
            try:
                reply = await asyncio.wait_for(client.refresh_lease(self._lease_id), remaining)
                held = await asyncio.wait_for(client.get(self.key), max(0.0, remaining - (self.clock() - started)))
            except ETCD_ERRORS as exc:
                log.warning("%s: controller lease refresh failed: %s", self.name, exc)
                continue  # still leader until the margin runs out
            if reply is None or reply.TTL <= 0 or held is None or held.lease != self._lease_id:
                log.warning("%s: the controller key is not held by this router's lease any more: deposed", self.name)
                return
            self._elected_at = started

    async def _step_down(self) -> None:
        self._elected_at = self.leader_id = None  # until the next campaign tells who leads
        await self._on_deposed()
        await self._revoke()  # frees the key at once if it is still ours

    async def _revoke(self) -> None:
        lease, self._lease_id = self._lease_id, None
        if lease is not None:
            try:
                await self.endpoints.client.revoke_lease(lease)
            except ETCD_ERRORS as exc:
                log.warning("%s: controller lease not revoked (it expires by itself): %s", self.name, exc)

    async def _wait_for_vacancy(self) -> None:
        """Note the leader, then wait for its key to change (or `ttl_s` at most). A key no
        campaign wrote is deleted first (as it was read), and the campaign starts again."""
        client = self.endpoints.client
        held = await client.get(self.key)
        if held is None:
            return  # gone already: campaign again
        self.leader_id = held.value.decode("utf-8", "replace")
        forged = self._forged(held)
        if forged is not None:
            log.warning("%s: the controller key names %r but %s; deleting it", self.name, self.leader_id, forged)
            await client.transaction(
                compare=[client.transactions.mod(self.key) == held.mod_revision],
                success=[client.transactions.delete(self.key)],
                failure=[],
            )
            self.leader_id = None
            return
        try:
            await client.watch_once(self.key, timeout=self.ttl_s, start_revision=held.mod_revision + 1)
        except ETCD_ERRORS:
            pass  # a timeout, or etcd unreachable: campaigning again tells

    def _forged(self, held) -> str | None:
        """Why the leader key, as read while this router is not leader, was not written by a
        campaign; None if it may have been."""
        if held.lease == 0:
            return "was written without a lease (it would outlive every router)"
        if self.leader_id == self.name:
            return "this router did not win it"
        return None

    async def close(self) -> None:
        """Stop campaigning; a leader stops its controller and frees the key at once."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._revoke()
        await self.endpoints.close()
