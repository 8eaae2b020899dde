"""The dashboard's view of the shared KV tier: each instance's `KVTierReport` (carried in its
instance row as `kv_tier`, instances.py) as the figures the page shows, and their sum.

`kv_tier_view(rows)` is None when no instance has a tier (the page then says "no KV tier"),
else `{"instances": [...], "total": {...}}`, each entry with the same keys as /metrics'
`minipd_kv_tier_*` series for its instance (the total: summed over the instances):
`instance` ("total" for the sum), `lookup_tokens`, `local_hit_tokens`, `tier_hit_tokens`,
`local_hit_rate` and `tier_hit_rate` (of the lookup tokens; None before any lookup),
`bytes_fetched`, `bytes_stored`, `blocks_stored`, `fetches` (the fetch histogram's count),
`fetch_seconds_sum`, `fetch_p50_s` and `fetch_p90_s` (estimated from the histogram's buckets
as Prometheus' `histogram_quantile` does; None without fetches), `fetch_fallbacks`,
`verification_failures`, `stores_skipped`, `stores_failed` and `timeouts`.
"""

from __future__ import annotations

from typing import Sequence

from minipd.control.kv_tier_report import FETCH_BUCKETS_S

COUNTS = (
    "lookup_tokens",
    "local_hit_tokens",
    "tier_hit_tokens",
    "bytes_fetched",
    "bytes_stored",
    "blocks_stored",
    "fetch_fallbacks",
    "verification_failures",
    "stores_skipped",
    "stores_failed",
    "timeouts",
)


def histogram_quantile(q: float, buckets: Sequence[int], bounds: Sequence[float] = FETCH_BUCKETS_S) -> float | None:
    """The `q` quantile of a histogram of per-bucket (not cumulative) counts with upper
    `bounds` (+Inf last, implied), interpolated linearly within its bucket from the bucket
    below's bound (0 for the first); in the +Inf bucket, the last finite bound. None when empty."""
    total = sum(buckets)
    if total == 0:
        return None
    rank, below, lower = q * total, 0, 0.0
    for count, upper in zip(buckets, bounds):
        if count and below + count >= rank:
            return lower + (upper - lower) * (rank - below) / count
        below, lower = below + count, upper
    return bounds[-1]


def _figures(name: str, counts: dict, buckets: Sequence[int], seconds: float) -> dict:
    lookup = counts["lookup_tokens"]
    return {
        "instance": name,
        **counts,
        "local_hit_rate": counts["local_hit_tokens"] / lookup if lookup else None,
        "tier_hit_rate": counts["tier_hit_tokens"] / lookup if lookup else None,
        "fetches": sum(buckets),
        "fetch_seconds_sum": seconds,
        "fetch_p50_s": histogram_quantile(0.5, buckets),
        "fetch_p90_s": histogram_quantile(0.9, buckets),
    }


def _buckets(report: dict) -> list[int]:
    return list(report.get("fetch_buckets") or [0] * (len(FETCH_BUCKETS_S) + 1))


def kv_tier_view(rows: Sequence[dict]) -> dict | None:
    """The tier figures of the instance rows that carry a report (module docstring)."""
    reports = [(row["instance"], row["kv_tier"]) for row in rows if row.get("kv_tier") is not None]
    if not reports:
        return None
    instances = [
        _figures(name, {k: r.get(k, 0) for k in COUNTS}, _buckets(r), r.get("fetch_seconds_sum", 0.0))
        for name, r in reports
    ]
    total_buckets = [sum(column) for column in zip(*(_buckets(r) for _, r in reports))]
    total_counts = {k: sum(i[k] for i in instances) for k in COUNTS}
    seconds = sum(i["fetch_seconds_sum"] for i in instances)
    return {"instances": instances, "total": _figures("total", total_counts, total_buckets, seconds)}
