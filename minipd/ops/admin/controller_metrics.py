"""The live ratio controller's series on the router's /metrics, read at scrape time from the
router's `ControllerSwitch` (the controller turned on and off at runtime; while off, only the
decisions so far and the target are exported).

- `minipd_controller_decisions_total{decision,reason}`: every decision the controller took
  (one per `--controller-interval-s`, counted across restarts), `decision` being `hold`, `to_prefill` or `to_decode`
  and `reason` the policy's cause, one of a fixed few (`DECISION_CAUSES` in
  minipd/policy/ratio_controller.py); every pair is exported from the start (zeros);
- `minipd_controller_attainment{objective}`: the attainments the latest decision weighed,
  `ttft` and `decode` (ratios; absent while not measured), and
  `minipd_controller_target_attainment`, the target they are held to;
- `minipd_controller_estimated_ttft_seconds` / `minipd_controller_observed_ttft_seconds` and
  `minipd_controller_estimated_itl_seconds` / `minipd_controller_observed_itl_seconds`: at
  the target quantile over the controller's window, what it blames on prefill (or judges per
  token) against what clients saw (minipd/ops/control_loop/controller_latency.py); absent without samples.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from minipd.api.app import METRICS_KEY
from minipd.ops.control_loop.controller_switch import ControllerSwitch
from minipd.policy.ratio_controller import DECISION_CAUSES

LATENCY_GAUGES = {
    "estimated_ttft": "TTFT the ratio controller blames on prefill (its decode wait taken out), at its target quantile",
    "observed_ttft": "TTFT at the router, at the ratio controller's target quantile over its window",
    "estimated_itl": "Per-token latency the ratio controller judges (gap, or TPOT so far), at its target quantile",
    "observed_itl": "Gap between a request's tokens at the router, at the ratio controller's target quantile",
}


class ControllerCollector(Collector):
    def __init__(self, switch: ControllerSwitch):
        self.switch = switch

    def collect(self) -> Iterable[Metric]:
        switch, ctl = self.switch, self.switch.controller
        decisions = CounterMetricFamily(
            "minipd_controller_decisions",
            "Decisions of the P:D ratio controller, by decision and reason",
            labels=["decision", "reason"],
        )
        for move, cause in DECISION_CAUSES:
            decisions.add_metric([move.name.lower(), cause], switch.decision_counts[move, cause])
        yield decisions
        attainment = GaugeMetricFamily(
            "minipd_controller_attainment",
            "Attainment the ratio controller's latest decision weighed, by objective",
            labels=["objective"],
        )
        last = ctl.last_decision if ctl is not None else None
        if last is not None:
            for objective, value in (("ttft", last.ttft_attainment), ("decode", last.decode_attainment)):
                if math.isfinite(value):
                    attainment.add_metric([objective], value)
        yield attainment
        yield GaugeMetricFamily(
            "minipd_controller_target_attainment",
            "Attainment the ratio controller holds each objective to",
            value=switch.config.target,
        )
        figures = ctl.latency_figures() if ctl is not None else dict.fromkeys(LATENCY_GAUGES)
        for name, value in figures.items():
            gauge = GaugeMetricFamily(f"minipd_controller_{name}_seconds", LATENCY_GAUGES[name])
            if value is not None:
                gauge.add_metric([], value)
            yield gauge


def controller_metrics(switch: ControllerSwitch) -> Callable[[web.Application], None]:
    """An app extension (`build_app(..., extensions=[...])`): the controller's series on /metrics."""

    def install(app: web.Application) -> None:
        app[METRICS_KEY].registry.register(ControllerCollector(switch))

    return install
