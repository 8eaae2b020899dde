"""The KV tier's series on /metrics (api/kv_tier_metrics.py): an instance's report becomes its
counters and fetch histogram; an instance without a tier has no series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from minipd.api.backend import InstanceStats
from minipd.api.kv_tier_metrics import KVTierCollector
from minipd.control.kv_tier_report import FETCH_BUCKETS_S, KVTierReport
from minipd.control.role import Role
from minipd.engine.block_manager import BlockUsage
from minipd.engine.config import EngineStats

STATS = EngineStats(0, 0, 0, BlockUsage(8, 8, 0, 0))


def scrape(instances: list[InstanceStats]) -> str:
    registry = CollectorRegistry()
    registry.register(KVTierCollector(lambda: instances))
    return generate_latest(registry).decode()


def test_a_report_becomes_the_instance_series():
    buckets = [0] * (len(FETCH_BUCKETS_S) + 1)
    buckets[3], buckets[-1] = 2, 1  # two fetches of at most 5 ms, one past the last bound
    report = KVTierReport(
        lookup_tokens=320,
        local_hit_tokens=64,
        tier_hit_tokens=128,
        bytes_fetched=4096,
        bytes_stored=8192,
        verification_failures=3,
        fetch_fallbacks=1,
        timeouts=2,
        fetch_buckets=tuple(buckets),
        fetch_seconds_sum=4.5,
    )
    text = scrape([InstanceStats("p0", Role.PREFILL, STATS, kv_tier=report), InstanceStats("d0", Role.DECODE, STATS)])
    assert 'minipd_kv_tier_hit_tokens_total{instance="p0",source="tier"} 128.0' in text
    assert 'minipd_kv_tier_hit_tokens_total{instance="p0",source="local"} 64.0' in text
    assert 'minipd_kv_tier_bytes_total{direction="fetched",instance="p0"} 4096.0' in text
    assert 'minipd_kv_tier_verification_failures_total{instance="p0"} 3.0' in text
    assert 'minipd_kv_tier_timeouts_total{instance="p0"} 2.0' in text
    assert 'minipd_kv_tier_fetch_seconds_bucket{instance="p0",le="0.005"} 2.0' in text
    assert 'minipd_kv_tier_fetch_seconds_bucket{instance="p0",le="+Inf"} 3.0' in text
    assert 'minipd_kv_tier_fetch_seconds_count{instance="p0"} 3.0' in text
    assert 'instance="d0"' not in text
