"""Rate sweeps over several deployments: interleaving, early stop and goodput, with fake runs."""

from __future__ import annotations

import pytest

from benchmarks.loadgen.rate_sweep import sweep_rates
from minipd.slo.targets import SLO

TIGHT, LOOSE = SLO.parse(["tpot:10"]), SLO.parse(["ttft:10"])


class FakeRun:
    """Stands in for a measured run: attainment falls linearly past a knee, per SLO."""

    def __init__(self, rate: float, knees: dict[SLO, float]):
        self.rate, self.knees = rate, knees

    def attainment(self, slo: SLO) -> float:
        return max(0.0, min(1.0, 1.0 - (self.rate - self.knees[slo])))


def test_deployments_take_turns_and_a_failing_one_stops_early():
    calls = []

    def runner(name: str, knees: dict):
        def run_at(rate: float, run_number: int) -> FakeRun:
            calls.append((name, rate, run_number))
            return FakeRun(rate, knees)

        return run_at

    runners = {"a": runner("a", {TIGHT: 0.5, LOOSE: 0.5}), "b": runner("b", {TIGHT: 3.0, LOOSE: 1.0})}
    sweeps = sweep_rates([1.0, 2.0, 3.0, 4.0], runners, {"tight": TIGHT, "loose": LOOSE}, stop_below=0.3)
    # a falls below 0.3 on both SLOs at 2.0 and stops; the order alternates rate by rate
    assert calls == [("a", 1.0, 0), ("b", 1.0, 0), ("b", 2.0, 1), ("a", 2.0, 1), ("b", 3.0, 2), ("b", 4.0, 3)]
    assert [p.rate for p in sweeps["a"].points] == [1.0, 2.0]
    assert sweeps["a"].goodput["tight"] == 0.0 and sweeps["a"].goodput_flags["tight"] == "below range"
    assert sweeps["b"].goodput["tight"] == pytest.approx(3.1) and sweeps["b"].goodput["loose"] == pytest.approx(1.1)


def test_bisection_refines_each_goodput_on_the_same_deployment():
    rates_run = []

    def run_at(rate: float, run_number: int) -> FakeRun:
        rates_run.append(rate)
        return FakeRun(rate, {TIGHT: 1.25})

    sweep = sweep_rates([1.0, 2.0], {"only": run_at}, {"tight": TIGHT}, bisect_steps=3)["only"]
    assert sweep.goodput["tight"] == pytest.approx(1.35, abs=1 / 2**3)
    assert rates_run[:2] == [1.0, 2.0] and len(rates_run) == 2 + 3  # bracket reused, three probes more
    assert [p.rate for p in sweep.points] == sorted(rates_run)
