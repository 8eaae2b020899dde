"""The dashboard's KV tier figures (ops/dashboard/kv_tier_view.py): None without a tier, each
instance's report as the page shows it and their sum, quantiles as Prometheus'
histogram_quantile interpolates them; and a snapshot carries them."""

from __future__ import annotations

import msgspec
import pytest

from minipd.control.kv_tier_report import FETCH_BUCKETS_S, KVTierReport
from minipd.ops.dashboard.kv_tier_view import histogram_quantile, kv_tier_view


def row(instance: str, report: KVTierReport | None, liveness: str = "alive") -> dict:
    return {
        "instance": instance,
        "liveness": liveness,
        "kv_tier": None if report is None else msgspec.to_builtins(report),
    }


def buckets(**counts: int) -> tuple[int, ...]:
    """Per-bucket counts by index (`b3=2`: two fetches in the fourth bucket), +Inf last."""
    values = [0] * (len(FETCH_BUCKETS_S) + 1)
    for name, count in counts.items():
        values[int(name[1:])] = count
    return tuple(values)


def test_no_tier_anywhere_is_none():
    assert kv_tier_view([row("p0", None), row("d0", None)]) is None
    assert kv_tier_view([]) is None


def test_quantiles_interpolate_within_their_bucket_as_prometheus_does():
    # 4 fetches in (0.001, 0.0025]: the median at rank 2 is halfway through that bucket
    assert histogram_quantile(0.5, buckets(b2=4)) == pytest.approx(0.001 + 0.0015 * 0.5)
    # the first bucket starts at 0
    assert histogram_quantile(0.5, buckets(b0=2)) == pytest.approx(0.00025)
    # a quantile in +Inf is the last finite bound
    assert histogram_quantile(0.9, buckets(b0=1, b12=9)) == FETCH_BUCKETS_S[-1]
    assert histogram_quantile(0.5, buckets()) is None


def test_each_instance_as_reported_and_the_total_as_their_sum():
    p0 = KVTierReport(
        lookup_tokens=160,
        local_hit_tokens=80,
        tier_hit_tokens=16,
        bytes_fetched=4096,
        bytes_stored=8192,
        blocks_stored=5,
        fetch_fallbacks=1,
        verification_failures=2,
        timeouts=3,
        fetch_buckets=buckets(b3=2),
        fetch_seconds_sum=0.008,
    )
    d0 = KVTierReport(lookup_tokens=0, bytes_stored=1024, blocks_stored=1, stores_skipped=4, stores_failed=5)
    view = kv_tier_view([row("p0", p0), row("d0", d0), row("x", None), row("gone", p0, liveness="dead")])
    assert [i["instance"] for i in view["instances"]] == ["p0", "d0", "gone"]
    shown = view["instances"][0]
    assert shown["local_hit_rate"] == 0.5 and shown["tier_hit_rate"] == 0.1
    assert shown["fetches"] == 2 and shown["fetch_seconds_sum"] == 0.008
    assert shown["fetch_p50_s"] == pytest.approx(0.0025 + 0.0025 * 0.5)
    assert (shown["timeouts"], shown["fetch_fallbacks"], shown["verification_failures"]) == (3, 1, 2)
    idle = view["instances"][1]
    assert idle["local_hit_rate"] is None and idle["fetches"] == 0 and idle["fetch_p90_s"] is None
    total = kv_tier_view([row("p0", p0), row("d0", d0)])["total"]
    assert total["instance"] == "total"
    assert (total["bytes_stored"], total["stores_skipped"], total["stores_failed"]) == (9216, 4, 5)
    assert total["lookup_tokens"] == 160 and total["tier_hit_rate"] == 0.1 and total["fetches"] == 2
