"""The tier's counters: a plain snapshot (`KVTierStats`) of thread-safe totals (`TierCounters`),
for whoever exports them (an instance's `KVTierReport`, on a router's /metrics)."""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class KVTierStats:
    """Totals since the tier was opened; every count is of blocks unless it says calls."""

    blocks_stored: int = 0  # values written to the store
    blocks_present: int = 0  # found in the store already by a store: nothing sent
    stores_skipped: int = 0  # not stored: over the bytes-in-flight bound, or no staging room
    stores_failed: int = 0  # not stored: the store failed or the call ran past its bound
    bytes_stored: int = 0  # headers and payloads written
    hits: int = 0  # fetched, verified and copied into the caller's buffers
    misses: int = 0  # asked for and not fetched: absent, failed, timed out or refused by verification
    verification_failures: int = 0  # a value under the key that failed the header or checksum check
    bytes_fetched: int = 0  # payload bytes copied into the caller's buffers
    timeouts: int = 0  # calls that ran past their bound
    errors: int = 0  # calls that failed in the store (an exception, an error code)


class TierCounters:
    """Adds to the totals from any thread (a fetch verifies in worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = dict.fromkeys((f.name for f in dataclasses.fields(KVTierStats)), 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._totals[name] += delta

    def snapshot(self) -> KVTierStats:
        with self._lock:
            return KVTierStats(**self._totals)
