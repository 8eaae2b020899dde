"""`minipd_disagg_decisions_total{decision}` on a router's /metrics: where each try's prompt was prefilled.

The counterpart of llm-d's `llm_d_inference_scheduler_disagg_decision_total`, read at scrape
time from the router's placement counts (`RouterCounters.placements`, one per try, counted
where the router decides, minipd/router/attempt.py through minipd/router/prefill_site.py).
The decisions are named after why, not after the policy's internal enum, so a dashboard
can tell the cluster's shape (no prefill instance) from load (prefill busy) and from size:

- `remote_prefill`: sent to a prefill instance, the KV streamed to the decode instance;
- `local_prefill_size`: its uncached part is short enough to prefill on the decode instance;
- `local_prefill_load`: the prefill pool was busy and the decode instance had room;
- `local_prefill_no_prefill_instance`: no prefill instance could take it.
Every decision is exported from the start (zeros), so a `rate()` sees the first one.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from minipd.policy.local_prefill import Placement
from minipd.router.router_counters import RouterCounters

DECISIONS = {placement: placement.decision for placement in Placement}  # named in minipd/policy/local_prefill.py


class DisaggDecisionCollector(Collector):
    """The router's disaggregation decisions so far, from its counters."""

    def __init__(self, counters: RouterCounters):
        self.counters = counters

    def collect(self) -> Iterable[Metric]:
        decisions = CounterMetricFamily(
            "minipd_disagg_decisions",
            "Prefill placement decisions of the router, one per try, by decision",
            labels=["decision"],
        )
        for placement, decision in DECISIONS.items():
            decisions.add_metric([decision], self.counters.placements[placement])
        yield decisions
