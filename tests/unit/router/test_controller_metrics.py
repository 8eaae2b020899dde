"""The live ratio controller's series on /metrics: its decisions by decision and reason, the
attainments it weighed, and the estimated against the observed TTFT and ITL, as it acts on a
fake router (test_live_controller_units.py's)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_live_controller_units import ITL_S, MIN_SAMPLES, TTFT_S, Clock, FakeRouter, Waiting
from test_placement_units import handle

from minipd.control.role import Role
from minipd.ops.admin.controller_metrics import ControllerCollector
from minipd.ops.control_loop.controller_latency import weighted_quantile
from minipd.ops.control_loop.controller_switch import ControllerSwitch
from minipd.ops.control_loop.live_controller import LiveControllerOptions, LiveRatioController
from minipd.policy.ratio_controller import DECISION_CAUSES, ControllerConfig, Move
from minipd.slo.targets import SLO

CONFIG = ControllerConfig(slo=SLO(ttft_s=TTFT_S, itl_s=ITL_S), window_s=10.0, cooldown_s=5.0, min_samples=MIN_SAMPLES)
OPTIONS = LiveControllerOptions(interval_s=60.0)  # it decides when the test ticks it


def controller(router: FakeRouter, clock: Clock) -> LiveRatioController:
    """A controller on `router`'s switch, on the test's clock, as the switch would start it."""
    switch = ControllerSwitch(router, CONFIG, OPTIONS)
    switch.controller = LiveRatioController(router, CONFIG, OPTIONS, clock, decision_counts=switch.decision_counts)
    switch.controller.switch = switch  # for scrape()
    return switch.controller


def scrape(ctl) -> dict[tuple[str, frozenset], float]:
    registry = CollectorRegistry()
    registry.register(ControllerCollector(ctl.switch))
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def decisions(values: dict, decision: str, reason: str) -> float:
    return values[("minipd_controller_decisions_total", frozenset({("decision", decision), ("reason", reason)}))]


def gauge(values: dict, name: str) -> float | None:
    return values.get((f"minipd_controller_{name}_seconds", frozenset()))


def test_decisions_are_counted_by_decision_and_reason_as_the_controller_acts(loop_thread):
    async def scenario():
        router = FakeRouter(
            handle("prefill-0", Role.PREFILL), handle("decode-0", Role.DECODE), handle("decode-1", Role.DECODE)
        )
        clock = Clock()
        ctl = controller(router, clock)
        before = scrape(ctl)
        ctl.tick()  # nothing observed yet
        few = scrape(ctl)
        for i in range(2 * MIN_SAMPLES):  # TTFT twice its SLO, tokens well within theirs
            ctl.first_token(f"r{i}", clock.now, 2 * TTFT_S, 0.0)
            ctl.tokens(clock.now, ITL_S / 2, 1, ITL_S / 2)
        clock.now += 1.0
        moved = ctl.tick()
        weighed = scrape(ctl)
        ctl.tick()  # the switch is still under way
        after = scrape(ctl)
        router.release.set()
        await ctl.close()
        return before, few, moved, weighed, after

    before, few, moved, weighed, after = loop_thread.run(scenario())
    assert moved.move is Move.TO_PREFILL
    for move, cause in DECISION_CAUSES:  # every pair exported from the start
        assert decisions(before, move.name.lower(), cause) == 0
    assert decisions(few, "hold", "too_few_samples") == 1
    assert sum(v for (n, _), v in few.items() if n == "minipd_controller_decisions_total") == 1
    assert decisions(after, "to_prefill", "ttft_short") == 1
    assert decisions(after, "hold", "moves_in_flight") == 1
    assert ("minipd_controller_attainment", frozenset({("objective", "ttft")})) not in few  # nan: not measured
    attainment = {
        objective: weighed[("minipd_controller_attainment", frozenset({("objective", objective)}))]
        for objective in ("ttft", "decode")
    }
    assert attainment == {"ttft": 0.0, "decode": 1.0}  # what the move weighed
    assert after[("minipd_controller_target_attainment", frozenset())] == 0.9


def test_estimated_ttft_leaves_out_the_decode_wait_the_observed_one_keeps(loop_thread):
    async def scenario():
        router = FakeRouter(handle("prefill-0", Role.PREFILL), handle("decode-0", Role.DECODE))
        clock = Clock()
        ctl = controller(router, clock)
        empty = scrape(ctl)
        for i in range(10):  # TTFTs 0.1 .. 1.0 s, of which 0.05 s waiting for decode room each
            ctl.first_token(f"r{i}", clock.now, 0.1 * (i + 1), 0.05)
        ctl.tokens(clock.now, 0.02, 9, 0.01)  # nine tokens 20 ms after their previous ones
        ctl.tokens(clock.now, 0.5, 1, 0.04)  # one after a 500 ms stall
        values = scrape(ctl)
        clock.now += 11.0  # past the 10 s window: every sample has aged out
        aged = scrape(ctl)
        router.release.set()
        await ctl.close()
        return empty, values, aged

    empty, values, aged = loop_thread.run(scenario())
    for name in ("estimated_ttft", "observed_ttft", "estimated_itl", "observed_itl"):
        assert gauge(empty, name) is None and gauge(aged, name) is None, name
    assert gauge(values, "observed_ttft") == pytest.approx(0.9)  # p90 of 0.1 .. 1.0
    assert gauge(values, "estimated_ttft") == pytest.approx(0.85)
    # an itl objective: the estimate judges the gaps themselves, token-weighted (p90 of nine 20 ms, one 500 ms)
    assert gauge(values, "estimated_itl") == gauge(values, "observed_itl") == pytest.approx(0.02)


def test_a_late_request_counts_with_its_wait_so_far_and_its_first_token_does_not_count_again(loop_thread):
    async def scenario():
        router = FakeRouter(handle("prefill-0", Role.PREFILL), handle("decode-0", Role.DECODE))
        clock = Clock()
        ctl = controller(router, clock)
        router.waiting = [Waiting("late", clock.now - 3.0, decode_wait_s=0.0)]
        ctl.tick()
        marked = scrape(ctl)
        router.waiting = []
        ctl.first_token("late", clock.now, 3.5, 0.0)  # its token comes at last
        later = scrape(ctl)
        await ctl.close()
        return marked, later

    marked, later = loop_thread.run(scenario())
    assert gauge(marked, "observed_ttft") == pytest.approx(3.0)
    assert gauge(marked, "estimated_ttft") == pytest.approx(3.0)
    assert gauge(later, "observed_ttft") == pytest.approx(3.0)


def test_the_weighted_quantile_is_the_smallest_value_holding_that_share_of_the_weight():
    assert weighted_quantile([], 0.9) is None
    assert weighted_quantile([(1.0, 1), (2.0, 1)], 0.5) == 1.0
    assert weighted_quantile([(1.0, 1), (2.0, 1)], 0.51) == 2.0
    assert weighted_quantile([(5.0, 1), (0.1, 99)], 0.99) == 0.1
    assert weighted_quantile([(5.0, 1), (0.1, 99)], 0.995) == 5.0


def test_decisions_are_counted_across_a_restart_and_an_off_controller_exports_only_counts(loop_thread):
    async def scenario():
        router = FakeRouter(handle("prefill-0", Role.PREFILL), handle("decode-0", Role.DECODE))
        switch = ControllerSwitch(router, CONFIG, OPTIONS)
        registry = CollectorRegistry()
        registry.register(ControllerCollector(switch))
        switch.start()
        switch.controller.tick()
        await switch.configure(target=0.8)  # a new policy: the controller restarts
        switch.controller.tick()
        on = generate_latest(registry).decode()
        await switch.stop()
        off = generate_latest(registry).decode()
        return on, off

    on, off = loop_thread.run(scenario())
    for text in (on, off):
        values = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert decisions(values, "hold", "too_few_samples") == 2  # one per controller
        assert values[("minipd_controller_target_attainment", frozenset())] == 0.8
    assert "minipd_controller_attainment{" not in off
