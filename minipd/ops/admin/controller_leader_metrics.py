"""`minipd_controller_leader`: 1 while this router runs the cluster's ratio controller (with
`--registry`, while it is the elected leader; without, while its controller is on), read
from `ControllerSwitch.leader` at scrape time."""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from minipd.ops.control_loop.controller_switch import ControllerSwitch


class ControllerLeaderCollector(Collector):
    def __init__(self, controller: ControllerSwitch):
        self.controller = controller

    def collect(self) -> Iterable[Metric]:
        gauge = GaugeMetricFamily("minipd_controller_leader", "1 while this router runs the ratio controller")
        gauge.add_metric([], int(self.controller.leader))
        yield gauge
