"""A decode instance's reservations: blocks held for prompts whose KV is on its way.

Lifecycle of one reservation:
1. `add` when `Reserve` is answered: the blocks are held, the transport expects the KV, and
   the lease runs for `lease_s`;
2. `renew` each time the prefill side reports progress pushes the deadline out again;
3. either `take` (the `Decode` message came: the caller owns the blocks, adopts them or hands
   them back with `release`), or `drop` (aborted, or the lease expired: `on_expired` is told).
Blocks that a dropped reservation (or a failed transfer) held go back to the engine only when
the transport says no late byte of that request can land in them (`Transport.abort`'s
`on_fenced`); until then they are counted in `num_fencing_blocks`, never reused, never lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, NamedTuple

from minipd.control.channel import Channel
from minipd.engine.engine import Engine
from minipd.transports.base import Transport

log = logging.getLogger(__name__)

SWEEPS_PER_LEASE = 4  # the lease sweep runs this often per lease


class Reservation(NamedTuple):
    token_ids: list[int]
    block_ids: list[int]
    num_cached_tokens: int
    deadline: float  # time.monotonic()
    channel: Channel  # where the Reserve came from (lease expiry is reported there)
    reserved_at: float = 0.0  # time.monotonic() when it was added (the request timeline's reference)


class Reservations:
    def __init__(
        self,
        engine: Engine,
        transport: Transport,
        lease_s: float,
        instance_id: str,
        on_expired: Callable[[str, Reservation], None],
    ):
        self.engine, self.transport, self.lease_s, self.instance_id = engine, transport, lease_s, instance_id
        self.held: dict[str, Reservation] = {}
        self.fencing: dict[str, list[int]] = {}  # request id -> blocks waiting for their fence
        self._on_expired = on_expired
        self._fenced = asyncio.Event()  # set whenever fencing blocks go back
        self._sweep: asyncio.Task | None = None

    def start(self) -> None:
        self._sweep = asyncio.get_running_loop().create_task(self._expire_leases())

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        for request_id in list(self.held):
            await self.drop(request_id)

    def add(
        self, request_id: str, token_ids: list[int], block_ids: list[int], num_cached_tokens: int, channel: Channel
    ) -> None:
        now = time.monotonic()
        self.held[request_id] = Reservation(token_ids, block_ids, num_cached_tokens, now + self.lease_s, channel, now)

    def take(self, request_id: str) -> Reservation | None:
        return self.held.pop(request_id, None)

    def renew(self, request_id: str) -> None:
        reservation = self.held.get(request_id)
        if reservation is not None:
            self.held[request_id] = reservation._replace(deadline=time.monotonic() + self.lease_s)

    async def drop(self, request_id: str) -> bool:
        """Abort a reservation not yet taken; False if there is none."""
        reservation = self.held.pop(request_id, None)
        if reservation is None:
            return False
        await self.release(request_id, reservation.block_ids)
        return True

    async def release(self, request_id: str, block_ids: list[int]) -> None:
        """Give a request's blocks back once its fence holds (at once when nothing can land)."""
        self.fencing[request_id] = block_ids
        await self.transport.abort(request_id, on_fenced=lambda: self._fence_holds(request_id))

    def _fence_holds(self, request_id: str) -> None:
        block_ids = self.fencing.pop(request_id, None)
        if block_ids is not None:
            self.engine.release_blocks(block_ids)
            self._fenced.set()

    @property
    def num_fencing_blocks(self) -> int:
        return sum(len(b) for b in self.fencing.values())

    async def wait_fenced(self, timeout_s: float) -> bool:
        """Wait until no block waits for its fence; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.fencing:
            self._fenced.clear()
            try:
                await asyncio.wait_for(self._fenced.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return not self.fencing
        return True

    async def _expire_leases(self) -> None:
        while True:
            await asyncio.sleep(max(self.lease_s / SWEEPS_PER_LEASE, 0.05))  # a periodic sweep
            now = time.monotonic()
            for request_id, reservation in list(self.held.items()):
                if reservation.deadline <= now and self.held.get(request_id) is reservation:
                    log.info("%s: lease of %s expired", self.instance_id, request_id)
                    try:
                        await self.drop(request_id)
                        self._on_expired(request_id, reservation)
                    except Exception:  # one expiry that fails must not end the sweep: later leases would never expire
                        log.exception("%s: expiring the lease of %s failed", self.instance_id, request_id)
