"""Redis as the tier's store (`redis://HOST:PORT/DB`), through redis-py's asyncio client.

A block is one string value (header and payload joined: SET takes one value, so the payload is
copied once, in a thread). Stores are `SET NX` (a key with a value is left as it is), lookups
`EXISTS`, fetches `MGET` in rounds of at most `MAX_ROUND_BYTES`, removals `DEL`, all pipelined.
Eviction is the server's: run it with `maxmemory` and an LRU policy (docs/kv-tier.md).
"""

from __future__ import annotations

from typing import Callable, Sequence

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from minipd.kvtier.backend import FAILED, PRESENT, STORED, Consume, Entry, TierBackend, consume_in_thread
from minipd.kvtier.daemon_pool import DaemonPool

MAX_ROUND_BYTES = 64 << 20  # a fetch's values in memory at once
MAX_CONNECTIONS = 32
JOIN_WORKERS = 2


class RedisBackend(TierBackend):
    name = "redis"

    def __init__(self, url: str, timeout_s: float) -> None:
        """`timeout_s` bounds each socket operation too, so a connection to a black-holed server
        is dropped rather than kept waiting. One retry, at once: a pooled connection to a server
        that restarted fails on first use, and its replacement should not cost a miss."""
        self.client = redis.Redis.from_url(  # public for tools and tests that reach the store directly
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
            max_connections=MAX_CONNECTIONS,
        )
        self._threads = DaemonPool(JOIN_WORKERS, "kvtier-redis")

    async def exists(self, keys: Sequence[str], leading: bool) -> list[bool]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(key)
        return [bool(n) for n in await pipe.execute()]

    async def put(self, entries: Sequence[Entry], done: Callable[[], None]) -> list[str]:
        # One copy, in a thread; `done` once it is made: the copies are all the put reads from then on.
        values = await self._threads.call(_join, entries, done=done)
        pipe = self.client.pipeline(transaction=False)
        for entry, value in zip(entries, values):
            pipe.set(entry.key, value, nx=True)
        replies = await pipe.execute(raise_on_error=False)
        return [STORED if reply is True else PRESENT if reply is None else FAILED for reply in replies]

    async def get(self, keys: Sequence[str], lengths: Sequence[int], consume: Consume) -> list[str | None]:
        statuses: list[str | None] = []
        for start, stop in _rounds(lengths, MAX_ROUND_BYTES):
            values = await self.client.mget(keys[start:stop])
            statuses += await consume_in_thread(values, lambda i, value, start=start: consume(start + i, value))
        return statuses

    async def remove(self, keys: Sequence[str]) -> int:
        return await self.client.delete(*keys)

    async def close(self) -> None:
        self._threads.shutdown()
        await self.client.aclose()


def _join(entries: Sequence[Entry]) -> list[bytes]:
    return [entry.header + b"".join(entry.payload) for entry in entries]


def _rounds(lengths: Sequence[int], max_bytes: int) -> list[tuple[int, int]]:
    """Consecutive index ranges whose lengths add up to at most `max_bytes` (at least one each)."""
    rounds, start, total = [], 0, 0
    for i, length in enumerate(lengths):
        if i > start and total + length > max_bytes:
            rounds.append((start, i))
            start, total = i, 0
        total += length
    if start < len(lengths):
        rounds.append((start, len(lengths)))
    return rounds
