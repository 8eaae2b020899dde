"""`KVTierReport`: an instance's use of the shared KV tier, as totals since it started, carried
in its `Stats` (None without `--kv-tier`) to the router, which exports them on /metrics
(api/kv_tier_metrics.py)."""

from __future__ import annotations

import msgspec

# upper bounds of the fetch latency histogram's buckets, in seconds (the last one is +Inf)
FETCH_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class KVTierReport(msgspec.Struct, frozen=True, kw_only=True):
    lookup_tokens: int = 0  # prompt tokens that could come from a cache (full blocks, last token excluded)
    local_hit_tokens: int = 0  # of those, found in the local prefix cache
    tier_hit_tokens: int = 0  # fetched from the tier, verified, into the pool
    fetch_fallbacks: int = 0  # fetches that got fewer blocks than the tier said it had: the rest computed
    fetches_declined: int = 0  # lookups or fetches not made: computing was predicted faster (fetch_cost.py)
    verification_failures: int = 0  # values under a valid key that failed the header or checksum check
    bytes_fetched: int = 0
    bytes_stored: int = 0
    blocks_stored: int = 0
    stores_skipped: int = 0  # over the bytes-in-flight bound, or no free staging: not stored
    stores_failed: int = 0  # the store failed or ran past its bound
    timeouts: int = 0  # tier calls (lookups, fetches, stores) that ran past their bound: misses
    # the fetch latency histogram: counts per bucket of FETCH_BUCKETS_S (not cumulative), +Inf last
    fetch_buckets: tuple[int, ...] = ()
    fetch_seconds_sum: float = 0.0
