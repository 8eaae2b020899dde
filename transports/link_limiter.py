"""A token bucket that caps a transport's egress rate, to emulate a slower link."""

from __future__ import annotations

import asyncio
import time

BITS_PER_BYTE = 8
GIGA = 1e9
# Tokens the bucket holds when idle: small, so a burst cannot hide the limit, but non-zero
# so that back-to-back small writes are not each delayed by timer granularity.
DEFAULT_BURST_BYTES = 256 * 1024


class LinkLimiter:
    """Releases bytes no faster than `gbps` gigabits per second on average.

    `acquire(n)` is awaited by the transport before it issues a move of `n` bytes; it
    returns when a link of that rate would have finished sending them, except that an idle
    link may run up to `burst_bytes` ahead. Waiters are served in call order. One limiter per transport:
    it models the sending instance's link, shared by all its peers.
    """

    def __init__(self, gbps: float, burst_bytes: int = DEFAULT_BURST_BYTES) -> None:
        if gbps <= 0:
            raise ValueError(f"link limit must be > 0 Gbit/s, got {gbps}")
        self.gbps = gbps
        self.bytes_per_second = gbps * GIGA / BITS_PER_BYTE
        self._burst_seconds = burst_bytes / self.bytes_per_second
        self._link_free_at = 0.0

    def reserve(self, num_bytes: int) -> float:
        """Book `num_bytes` on the link; return how many seconds to wait before sending."""
        now = time.monotonic()
        self._link_free_at = max(self._link_free_at, now - self._burst_seconds) + num_bytes / self.bytes_per_second
        return self._link_free_at - now

    async def acquire(self, num_bytes: int) -> None:
        delay = self.reserve(num_bytes)
        if delay > 0:
            await asyncio.sleep(delay)
