"""The pool scaler's series on the router's /metrics (a router a scaling launcher started:
ops/control_loop/pool_scaler.py), read at scrape time.

- `minipd_controller_scale_events_total{action,role}`: instances added (`add`) and removed
  (`remove`) per role, once done; every pair exported from the start (zeros);
- `minipd_controller_scale_failures_total{action,role}`: those that failed (the launcher had
  no room after all, the instance did not start or did not drain);
- `minipd_controller_scale_in_flight`: 1 while an add or a remove is under way;
- `minipd_pool_instances{role}`: instances serving in each role now (prefill, decode, both);
- `minipd_pool_bounds{role,bound}`: each scaled pool's `min` and `max`.
"""

from __future__ import annotations

from typing import Callable, Iterable

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from minipd.api.app import METRICS_KEY
from minipd.ops.control_loop.pool_scaler import LivePoolScaler
from minipd.policy.pool_scaling import SCALED_ROLES

ACTIONS = ("add", "remove")


class ScaleCollector(Collector):
    def __init__(self, scaler: LivePoolScaler):
        self.scaler = scaler

    def collect(self) -> Iterable[Metric]:
        scaler = self.scaler
        for name, text, counts in (
            ("minipd_controller_scale_events", "Instances the pool scaler added or removed", scaler.counts),
            ("minipd_controller_scale_failures", "Adds and removes of the pool scaler that failed", scaler.failures),
        ):
            family = CounterMetricFamily(name, text, labels=["action", "role"])
            for action in ACTIONS:
                for role in SCALED_ROLES:
                    family.add_metric([action, role], counts[action, role])
            yield family
        yield GaugeMetricFamily(
            "minipd_controller_scale_in_flight", "1 while the pool scaler adds or removes an instance",
            value=scaler.in_flight,
        )  # fmt: skip
        sizes = GaugeMetricFamily("minipd_pool_instances", "Instances serving in each role now", labels=["role"])
        for role, size in scaler.pool_sizes().items():
            sizes.add_metric([role.value], size)
        yield sizes
        bounds = GaugeMetricFamily(
            "minipd_pool_bounds", "The smallest and largest size of each scaled pool", labels=["role", "bound"]
        )
        for role in SCALED_ROLES:
            bounds.add_metric([role, "min"], scaler.config.bounds.min(role))
            bounds.add_metric([role, "max"], scaler.config.bounds.max(role))
        yield bounds


def scale_metrics(scaler: LivePoolScaler) -> Callable[[web.Application], None]:
    """An app extension (`build_app(..., extensions=[...])`): the pool scaler's series on /metrics."""

    def install(app: web.Application) -> None:
        app[METRICS_KEY].registry.register(ScaleCollector(scaler))

    return install
