"""The shared KV tier on a router's /metrics, per instance, from the `KVTierReport` each
instance with `--kv-tier` carries in its stats (an instance without one has no series here):

- `minipd_kv_tier_lookup_tokens_total{instance}`: prompt tokens that could come from a cache
  (its full blocks, the last token excluded);
- `minipd_kv_tier_hit_tokens_total{instance,source}`: of those, found in the local prefix cache
  (`local`) or fetched from the tier (`tier`); the rest were computed;
- `minipd_kv_tier_bytes_total{instance,direction}`: `fetched` and `stored`;
- `minipd_kv_tier_blocks_stored_total{instance}`, `minipd_kv_tier_stores_skipped_total{instance}`
  (over the bytes-in-flight bound) and `minipd_kv_tier_stores_failed_total{instance}`;
- `minipd_kv_tier_fetch_fallbacks_total{instance}`: fetches that got fewer blocks than the tier
  said it had (the rest computed); `minipd_kv_tier_verification_failures_total{instance}`;
- `minipd_kv_tier_fetches_declined_total{instance}`: lookups or fetches not made because
  computing the blocks was predicted faster (kvtier/fetch_cost.py);
- `minipd_kv_tier_timeouts_total{instance}`: tier calls that ran past their bound (a slow
  store: the prompt was computed after it);
- `minipd_kv_tier_fetch_seconds{instance}`: a histogram of fetch latencies.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from minipd.api.backend import InstanceStats
from minipd.control.kv_tier_report import FETCH_BUCKETS_S

COUNTERS = (
    ("lookup_tokens", "lookup_tokens", "Prompt tokens that could come from a cache (full blocks, last token excluded)"),
    ("blocks_stored", "blocks_stored", "KV blocks this instance stored in the tier"),
    ("stores_skipped", "stores_skipped", "KV blocks not stored: over the bytes-in-flight bound"),
    ("stores_failed", "stores_failed", "KV blocks not stored: the store failed or ran past its bound"),
    ("fetch_fallbacks", "fetch_fallbacks", "Fetches that got fewer blocks than the tier had: the rest computed"),
    ("fetches_declined", "fetches_declined", "Lookups or fetches not made: computing was predicted faster"),
    ("verification_failures", "verification_failures", "Fetched values that failed verification (never used)"),
    ("timeouts", "timeouts", "Tier calls that ran past their bound (a slow or black-holed store): misses"),
)


class KVTierCollector(Collector):
    def __init__(self, instance_stats: Callable[[], list[InstanceStats]]):
        self._instance_stats = instance_stats

    def collect(self) -> Iterable[Metric]:
        counters = {
            field: CounterMetricFamily(f"minipd_kv_tier_{name}", text, labels=["instance"])
            for field, name, text in COUNTERS
        }
        hits = CounterMetricFamily(
            "minipd_kv_tier_hit_tokens", "Prompt tokens found in a cache, by source", labels=["instance", "source"]
        )
        moved = CounterMetricFamily(
            "minipd_kv_tier_bytes", "Bytes fetched from and stored in the tier", labels=["instance", "direction"]
        )
        fetch = HistogramMetricFamily(
            "minipd_kv_tier_fetch_seconds", "Latency of fetches from the tier", labels=["instance"]
        )
        for instance in self._instance_stats():
            report = instance.kv_tier
            if report is None:
                continue
            name = instance.name
            for field, family in counters.items():
                family.add_metric([name], getattr(report, field))
            hits.add_metric([name, "local"], report.local_hit_tokens)
            hits.add_metric([name, "tier"], report.tier_hit_tokens)
            moved.add_metric([name, "fetched"], report.bytes_fetched)
            moved.add_metric([name, "stored"], report.bytes_stored)
            if report.fetch_buckets:
                cumulative = list(itertools.accumulate(report.fetch_buckets))
                bounds = [str(b) for b in FETCH_BUCKETS_S] + ["+Inf"]
                fetch.add_metric([name], list(zip(bounds, cumulative)), report.fetch_seconds_sum)
        yield from (*counters.values(), hits, moved, fetch)
