"""Prometheus metrics of one serving front, in its own `CollectorRegistry`.

Every name starts with `minipd_` and carries its unit. Latencies follow the usual definitions:
TTFT is arrival at the front to the first token leaving it; ITL is each gap between
token-carrying increments; end-to-end is arrival to the last increment; queue time is
the engine's arrival-to-first-scheduled. Request-level series are recorded by
`RequestRecorder` (one per request), which also records the KV transfer that a final
output reports in `RequestOutput.transfer`; each disaggregated request also observes its
phases in `minipd_disagg_phase_seconds{phase}` (PHASES: the figures its `TransferInfo`
carries, and its TTFT as measured here); failed transfers are recorded by
`record_transfer_failure`, which the app wires to its backend. On a colocated instance the
transfer series stay at zero. Instance gauges are read from the backend at scrape time, from the
instances' latest reports (polled all at once, each with a short timeout): an instance that
disappears disappears from /metrics too, and one whose report is late is flagged by
`minipd_instance_stats_stale`.

What one request records, as it goes, is request_metrics.py's (`RequestRecorder`, the phase
and abort names); it also keeps the front's recent requests in `ServingMetrics.recent`
(`RecentRequests`: bounded rings of samples and finished requests), which the dashboard's
window reads when it is read (ops/dashboard/request_window.py): a request pays a few appends
for it, whoever watches.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from minipd.api.backend import InstanceStats
from minipd.api.kv_tier_metrics import KVTierCollector
from minipd.api.request_metrics import (
    ABORT_CLIENT_DISCONNECT,
    ABORT_ENGINE_ERROR,
    ABORT_OTHER,
    PHASES,
    RecentRequests,
    RequestRecorder,
    record_phases,
    record_transfer,
)
from minipd.engine.request import FinishReason, TransferInfo

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.0)
TRANSFER_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

PHASE_BUCKETS_S = (0.0001, 0.00025, 0.0005, *LATENCY_BUCKETS_S)
# minipd_request_overloads_total{cause}: requests answered 503 for want of capacity
OVERLOAD_WAITING_LIMIT = "waiting_limit"  # --max-waiting-requests were waiting already
OVERLOAD_KV_CAPACITY = "kv_capacity"  # no KV room: refused at admission, or none freed in time
OVERLOAD_UNAVAILABLE = "unavailable"  # nothing to serve it (no instance reachable)
OVERLOAD_CAUSES = (OVERLOAD_WAITING_LIMIT, OVERLOAD_KV_CAPACITY, OVERLOAD_UNAVAILABLE)


class InstanceCollector(Collector):
    """Gauges of every instance, read from `instance_stats()` on each scrape."""

    def __init__(self, instance_stats: Callable[[], list[InstanceStats]]):
        self._instance_stats = instance_stats

    def collect(self) -> Iterable[Metric]:
        running = GaugeMetricFamily("minipd_requests_running", "Requests running on an instance", labels=["instance"])
        waiting = GaugeMetricFamily("minipd_requests_waiting", "Requests waiting on an instance", labels=["instance"])
        prefilling = GaugeMetricFamily(
            "minipd_requests_prefilling", "Running requests whose prompt is not all computed yet", labels=["instance"]
        )
        decoding = GaugeMetricFamily(
            "minipd_requests_decoding", "Running requests past their prompt, generating", labels=["instance"]
        )
        blocks = {
            state: GaugeMetricFamily(f"minipd_kv_blocks_{state}", text, labels=["instance"])
            for state, text in (
                ("total", "KV blocks in the instance's pool"),
                ("free", "KV blocks with no reference (cached ones included)"),
                ("used", "KV blocks referenced by a request"),
                ("cached", "KV blocks registered in the prefix cache, used or free"),
            )
        }
        role = GaugeMetricFamily(
            "minipd_instance_role", "1 for the role each instance has", labels=["instance", "role"]
        )
        stale = GaugeMetricFamily(
            "minipd_instance_stats_stale",
            "1 while an instance's stats did not arrive in time lately (its other gauges are then old)",
            labels=["instance"],
        )
        for instance in self._instance_stats():
            name, stats, usage = instance.name, instance.stats, instance.stats.blocks
            running.add_metric([name], stats.num_running)
            waiting.add_metric([name], stats.num_waiting)
            prefilling.add_metric([name], stats.num_prefilling)
            decoding.add_metric([name], stats.num_running - stats.num_prefilling)
            for state, value in (
                ("total", usage.num_blocks),
                ("free", usage.num_free),
                ("used", usage.num_used),
                ("cached", usage.num_cached),
            ):
                blocks[state].add_metric([name], value)
            role.add_metric([name, instance.role.value], 1)
            stale.add_metric([name], int(instance.stale))
        yield from (running, waiting, prefilling, decoding, *blocks.values(), role, stale)


class ServingMetrics:
    """The metrics of one front; several can live in one process (one registry each)."""

    def __init__(self, instance_stats: Callable[[], list[InstanceStats]]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "minipd_time_to_first_token_seconds", "Arrival to first token", registry=r, buckets=LATENCY_BUCKETS_S
        )
        self.itl = Histogram(
            "minipd_inter_token_latency_seconds",
            "Gap between streamed token increments",
            registry=r,
            buckets=ITL_BUCKETS_S,
        )
        self.e2e = Histogram(
            "minipd_e2e_request_latency_seconds", "Arrival to the last token", registry=r, buckets=LATENCY_BUCKETS_S
        )
        self.queue = Histogram(
            "minipd_request_queue_time_seconds",
            "Arrival to first scheduled, in the engine",
            registry=r,
            buckets=LATENCY_BUCKETS_S,
        )
        self.transfer = Histogram(
            "minipd_kv_transfer_seconds",
            "Wall time of one request's KV transfer",
            registry=r,
            buckets=TRANSFER_BUCKETS_S,
        )
        self.transfer_exposed = Histogram(
            "minipd_kv_transfer_exposed_seconds",
            "End of prefill compute to the last KV byte acknowledged",
            registry=r,
            buckets=TRANSFER_BUCKETS_S,
        )
        self.phases = Histogram(
            "minipd_disagg_phase_seconds",
            "Phases of a disaggregated request (prefilled on another instance than its decode one)",
            ["phase"],
            registry=r,
            buckets=PHASE_BUCKETS_S,
        )
        self.requests = Counter("minipd_requests", "Finished requests by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("minipd_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("minipd_generation_tokens", "Generated tokens", registry=r)
        self.transfer_bytes = Counter("minipd_kv_transfer_bytes", "KV bytes transferred", registry=r)
        self.transfer_failures = Counter("minipd_kv_transfer_failures", "KV transfers that failed", registry=r)
        self.aborts = Counter("minipd_request_aborts", "Aborted requests by cause", ["cause"], registry=r)
        self.overloads = Counter(
            "minipd_request_overloads", "Requests answered 503 for want of capacity, by cause", ["cause"], registry=r
        )
        for reason in FinishReason:  # export zeros, so a rate() sees the first request
            self.requests.labels(reason.value)
        for cause in (ABORT_CLIENT_DISCONNECT, ABORT_ENGINE_ERROR, ABORT_OTHER):
            self.aborts.labels(cause)
        for phase in PHASES:
            self.phases.labels(phase)
        for cause in OVERLOAD_CAUSES:
            self.overloads.labels(cause)
        r.register(InstanceCollector(instance_stats))
        r.register(KVTierCollector(instance_stats))
        self.recent = RecentRequests()

    def record_transfer(self, num_bytes: int, seconds: float, exposed_seconds: float) -> None:
        """One request's KV transfer finished: its size, wall time and exposed part."""
        record_transfer(self, num_bytes, seconds, exposed_seconds)

    def record_phases(self, transfer: TransferInfo, ttft_s: float | None) -> None:
        """A disaggregated request finished: its phases (request_metrics.record_phases)."""
        record_phases(self, transfer, ttft_s)

    def record_transfer_failure(self) -> None:
        self.transfer_failures.inc()

    def record_overload(self, cause: str) -> None:
        """A request is answered 503 for want of capacity (one of OVERLOAD_CAUSES)."""
        self.overloads.labels(cause).inc()

    def start_request(self) -> RequestRecorder:
        """Call on arrival of a request; the recorder times it from now (request_metrics.py)."""
        return RequestRecorder(self)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
