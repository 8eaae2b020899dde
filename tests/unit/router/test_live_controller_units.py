"""The live ratio controller on a fake router: what it observes (first tokens, gaps, requests
late for their first token), which instance it moves, one move at a time, and what it records."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import NamedTuple

import msgspec
import pytest
from test_placement_units import handle

from minipd.control.role import Role
from minipd.ops.control_loop.live_controller import LiveControllerOptions, LiveRatioController, pick_mover
from minipd.policy.ratio_controller import ControllerConfig, Move
from minipd.router.registry import InstanceHandle, InstanceRegistry
from minipd.router.role_switch_driver import SwitchFailed
from minipd.slo.targets import SLO

TTFT_S, ITL_S = 0.5, 0.05
MIN_SAMPLES = 10


class FakeRouter:
    """What the controller uses of a router; `switch_role` sets `switched` once asked, then
    waits for `release` to finish."""

    def __init__(self, *handles, fail: bool = False):
        self.registry = InstanceRegistry()
        for h in handles:
            self.registry.add(h)
        self.latency_observer = None
        self.waiting: list = []
        self.switches: list[tuple[str, Role]] = []
        self.switched = asyncio.Event()
        self.release = asyncio.Event()
        self.fail = fail

    def awaiting_first_token(self):
        return self.waiting

    async def switch_role(self, instance_id: str, role: Role, drain_timeout_s: float):
        self.switches.append((instance_id, role))
        self.switched.set()
        await self.release.wait()
        if self.fail:
            raise SwitchFailed(f"{instance_id} did not switch: drain timeout", "timeout")
        handle = self.registry.instances[instance_id]
        handle.take_role(role, handle.epoch + 1)
        return SimpleNamespace(total_s=0.25, drain_s=0.2)


class Waiting(NamedTuple):
    """A request awaiting its first token, as the controller sees it (RoutedRequest's fields)."""

    request_id: str
    arrival_s: float
    decode_wait_s: float = 0.0
    prefilled_locally: bool = False

    def decode_wait_so_far(self, now: float) -> float:
        return now - self.arrival_s if self.prefilled_locally else self.decode_wait_s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def controller(router: FakeRouter, clock: Clock) -> LiveRatioController:
    config = ControllerConfig(
        slo=SLO(ttft_s=TTFT_S, itl_s=ITL_S), window_s=10.0, cooldown_s=5.0, min_samples=MIN_SAMPLES
    )
    return LiveRatioController(router, config, LiveControllerOptions(interval_s=1.0), clock=clock)


def feed(ctl: LiveRatioController, clock: Clock, ttft_s: float, gap_s: float, n: int = 2 * MIN_SAMPLES) -> None:
    for i in range(n):
        ctl.first_token(f"r{clock.now}-{i}", clock.now, ttft_s, 0.0)
        ctl.tokens(clock.now, gap_s, 1, gap_s)
    clock.now += 1.0


def test_failing_ttft_moves_the_least_busy_decode_instance_to_prefill_one_move_at_a_time(loop_thread):
    async def scenario():
        busy, idle = handle("decode-busy", Role.DECODE, running=5), handle("decode-idle", Role.DECODE, running=1)
        router = FakeRouter(handle("prefill-0", Role.PREFILL), busy, idle, handle("colocated-0", Role.BOTH))
        clock = Clock()
        ctl = controller(router, clock)
        assert router.latency_observer is ctl
        feed(ctl, clock, ttft_s=2 * TTFT_S, gap_s=ITL_S / 2)
        first = ctl.tick()
        clock.now += 10.0  # past the cool-down: only the switch under way holds the next move
        feed(ctl, clock, ttft_s=2 * TTFT_S, gap_s=ITL_S / 2)
        second = ctl.tick()
        router.release.set()
        await ctl.close()
        return router, ctl, first, second

    router, ctl, first, second = loop_thread.run(scenario())
    assert first.move is Move.TO_PREFILL and second.move is Move.HOLD and second.reason == "moves in flight"
    assert router.switches == [("decode-idle", Role.PREFILL)]
    assert router.registry.instances["decode-idle"].role is Role.PREFILL
    [move] = ctl.moves
    assert (move.instance_id, move.from_role, move.to_role, move.outcome) == (
        "decode-idle",
        Role.DECODE,
        Role.PREFILL,
        "switched",
    )
    assert move.ttft_attainment == 0.0 and move.total_s == 0.25 and move.drain_s == 0.2
    assert router.latency_observer is None, "closing detaches the observer"


def _on(h, compute: str):
    h.welcome = msgspec.structs.replace(h.welcome, compute=compute)
    return h


@pytest.mark.parametrize(
    ("loaded_on", "light_on", "decode_on", "moved"),
    [
        ("", "", "", "prefill-light"),  # hardware not said: the least queued
        # three instances on two cores: prefill-light shares decode-0's core, so moving it
        # would add a decode instance without adding decode compute
        ("node/cpu:1", "node/cpu:0", "node/cpu:0", "prefill-loaded"),
    ],
)
def test_failing_itl_moves_a_prefill_instance_off_the_decode_hardware_then_the_least_queued(
    loop_thread, loaded_on, light_on, decode_on, moved
):
    async def scenario():
        loaded = _on(handle("prefill-loaded", Role.PREFILL), loaded_on)
        light = _on(handle("prefill-light", Role.PREFILL), light_on)
        router = FakeRouter(loaded, light, _on(handle("decode-0", Role.DECODE), decode_on))
        clock = Clock()
        ctl = controller(router, clock)
        feed(ctl, clock, ttft_s=TTFT_S / 2, gap_s=2 * ITL_S)
        with loaded.counted(num_prompt_tokens=500), light.counted(num_prompt_tokens=100):
            decision = ctl.tick()
        router.release.set()
        await ctl.close()
        return router, decision

    router, decision = loop_thread.run(scenario())
    assert decision.move is Move.TO_DECODE and router.switches == [(moved, Role.DECODE)]


def test_the_mover_shares_hardware_with_the_fewest_of_its_new_role_then_has_the_least_work():
    shapes = (("a", 0, "n/cpu:0"), ("b", 3, "n/cpu:1"), ("c", 1, ""))
    a, b, c = (_on(handle(name, Role.DECODE, running=running), compute) for name, running, compute in shapes)
    prefill = [_on(handle("p", Role.PREFILL), "n/cpu:0")]
    assert pick_mover([a, b, c], prefill, InstanceHandle.running) is c  # unknown hardware shares with none
    assert pick_mover([a, b], prefill, InstanceHandle.running) is b  # a shares p's core
    assert pick_mover([a, b], [], InstanceHandle.running) is a  # nothing to share with: the least work


def test_requests_late_for_their_first_token_count_as_misses_once(loop_thread):
    async def scenario():
        router = FakeRouter(
            handle("prefill-0", Role.PREFILL), handle("decode-0", Role.DECODE), handle("decode-1", Role.DECODE)
        )
        clock = Clock()
        ctl = controller(router, clock)
        feed(ctl, clock, ttft_s=TTFT_S / 2, gap_s=ITL_S / 2, n=MIN_SAMPLES)  # all good so far
        late = [Waiting(f"late-{i}", clock.now - 2 * TTFT_S) for i in range(2 * MIN_SAMPLES)]
        fresh = Waiting("fresh", clock.now)
        router.waiting = [*late, fresh]
        decision = ctl.tick()  # the late ones now outnumber the good first tokens
        again = ctl.tick()
        for r in late:  # their first tokens come at last: not observed a second time
            ctl.first_token(r.request_id, clock.now, 2 * TTFT_S, 0.0)
        marked = set(ctl._late)
        router.release.set()
        await ctl.close()
        return decision, again, marked

    decision, again, marked = loop_thread.run(scenario())
    assert decision.move is Move.TO_PREFILL
    assert decision.ttft_attainment == pytest.approx(MIN_SAMPLES / (3 * MIN_SAMPLES))
    assert again.move is Move.HOLD and again.ttft_attainment == 0.0  # the move restarted the window
    assert marked == set(), "late requests are forgotten once their first token came"


def test_a_failed_switch_is_recorded_and_the_controller_carries_on(loop_thread):
    async def scenario():
        router = FakeRouter(
            handle("prefill-0", Role.PREFILL),
            handle("decode-0", Role.DECODE),
            handle("decode-1", Role.DECODE),
            fail=True,
        )
        router.release.set()
        clock = Clock()
        ctl = controller(router, clock)
        feed(ctl, clock, ttft_s=2 * TTFT_S, gap_s=ITL_S / 2)
        ctl.tick()
        await asyncio.gather(*ctl._moving)
        in_flight = ctl._in_flight
        await ctl.close()
        return router, ctl, in_flight

    router, ctl, in_flight = loop_thread.run(scenario())
    assert ctl.moves[0].outcome.startswith("failed:") and "drain timeout" in ctl.moves[0].outcome
    assert in_flight == 0
    assert {h.role for h in router.registry.instances.values()} == {Role.PREFILL, Role.DECODE}
    assert router.registry.instances["decode-0"].role is Role.DECODE


@pytest.mark.parametrize("objective, expected", [("tpot", Move.TO_DECODE), ("itl", Move.HOLD)])
def test_a_tpot_objective_counts_a_stall_against_every_later_token(loop_thread, objective, expected):
    """Gaps within the bound after one long stall: each request's TPOT so far is over it."""

    async def scenario():
        router = FakeRouter(
            handle("prefill-0", Role.PREFILL), handle("prefill-1", Role.PREFILL), handle("decode-0", Role.DECODE)
        )
        clock = Clock()
        slo = SLO(ttft_s=TTFT_S, **{f"{objective}_s": ITL_S})
        ctl = LiveRatioController(
            router, ControllerConfig(slo=slo, window_s=10.0, cooldown_s=5.0, min_samples=MIN_SAMPLES), clock=clock
        )
        for i in range(2 * MIN_SAMPLES):
            ctl.first_token(f"r{i}", clock.now, TTFT_S / 2, 0.0)
            ctl.tokens(clock.now, ITL_S / 2, 1, 3 * ITL_S)  # quick gaps, but a stall earlier in the request
        clock.now += 1.0
        decision = ctl.tick()
        router.release.set()
        await ctl.close()
        return decision

    assert loop_thread.run(scenario()).move is expected


@pytest.mark.parametrize("locally, expected", [(True, Move.TO_DECODE), (False, Move.HOLD)])
def test_a_late_prompt_prefilled_on_its_decode_instance_is_decode_trouble(loop_thread, locally, expected):
    """It queues on the decode instance: more decode shortens that wait, more prefill cannot
    (and with one decode instance, a prefill move is impossible anyway: hold)."""

    async def scenario():
        router = FakeRouter(
            handle("prefill-0", Role.PREFILL), handle("prefill-1", Role.PREFILL), handle("decode-0", Role.DECODE)
        )
        clock = Clock()
        ctl = controller(router, clock)
        feed(ctl, clock, ttft_s=TTFT_S / 2, gap_s=ITL_S / 2, n=MIN_SAMPLES)
        router.waiting = [
            Waiting(f"w{i}", clock.now - 2 * TTFT_S, prefilled_locally=locally) for i in range(2 * MIN_SAMPLES)
        ]
        decision = ctl.tick()
        router.release.set()
        await ctl.close()
        return decision

    assert loop_thread.run(scenario()).move is expected


def test_a_controller_that_may_not_decide_moves_nothing_until_it_may(loop_thread):
    """The elected-leader guard: asked before each decision, so a deposed router decides nothing."""

    async def scenario():
        busy, idle = handle("decode-busy", Role.DECODE, running=5), handle("decode-idle", Role.DECODE, running=1)
        router = FakeRouter(handle("prefill-0", Role.PREFILL), busy, idle)
        clock, allowed, asked = Clock(), [False], []
        enough_asked = asyncio.Event()

        def may_decide() -> bool:
            asked.append(allowed[0])
            if asked.count(False) >= 5:
                enough_asked.set()
            return allowed[0]

        config = ControllerConfig(
            slo=SLO(ttft_s=TTFT_S, itl_s=ITL_S), window_s=10.0, cooldown_s=5.0, min_samples=MIN_SAMPLES
        )
        ctl = LiveRatioController(
            router, config, LiveControllerOptions(interval_s=0.01), clock=clock, may_decide=may_decide
        )
        feed(ctl, clock, ttft_s=2 * TTFT_S, gap_s=ITL_S / 2)  # failing TTFT: a move is due
        ctl.start()
        await asyncio.wait_for(enough_asked.wait(), 10.0)
        held = (ctl.last_decision, list(router.switches))
        allowed[0] = True
        await asyncio.wait_for(router.switched.wait(), 10.0)  # at the controller's next period
        router.release.set()
        await ctl.close()
        return held, router.switches

    (decision, switches_meanwhile), switches = loop_thread.run(scenario())
    assert decision is None and switches_meanwhile == []
    assert switches == [("decode-idle", Role.PREFILL)]
