"""The P:D ratio controller: the pure policy on synthetic measurements, then inside the
simulator on a shifting workload (prefill-heavy, then decode-heavy)."""

from __future__ import annotations

import itertools

import pytest
from planner_helpers import profile

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.sim_summary import good_requests
from minipd.ops.planner.simulator import Simulator
from minipd.ops.workload import ArrivalProcess, make_workload
from minipd.policy.local_prefill import LocalPrefillThresholds
from minipd.policy.ratio_controller import ControllerConfig, Move, RatioController
from minipd.slo.targets import SLO

SLO_ = SLO.parse(["ttft:300", "itl:40"])
COOLDOWN_S = 3.0


def _controller(**overrides) -> RatioController:
    return RatioController(ControllerConfig(slo=SLO_, window_s=5.0, cooldown_s=COOLDOWN_S, min_samples=20, **overrides))


def _feed(ctl: RatioController, start: float, ttft_ok: float, itl_ok: float, n: int = 100) -> float:
    """n TTFT samples and n decode steps over one second, the given fractions within the SLOs."""
    for i in range(n):
        t = start + i / n
        ctl.observe_ttft(t, 0.1 if i < ttft_ok * n else 1.0)
        ctl.observe_tokens(t, 0.02 if i < itl_ok * n else 0.08, count=4)
    return start + 1.0


def test_failing_ttft_moves_an_instance_to_prefill_and_failing_itl_to_decode() -> None:
    ctl = _controller()
    now = _feed(ctl, 0.0, ttft_ok=0.5, itl_ok=1.0)
    assert ctl.decide(now, 2, 6).move is Move.TO_PREFILL
    ctl = _controller()
    now = _feed(ctl, 0.0, ttft_ok=1.0, itl_ok=0.5)
    assert ctl.decide(now, 2, 6).move is Move.TO_DECODE


def test_small_shortfalls_and_even_trouble_hold_inside_the_hysteresis_band() -> None:
    ctl = _controller()
    now = _feed(ctl, 0.0, ttft_ok=0.87, itl_ok=1.0)  # 3 points below target: inside the 5-point band
    assert ctl.decide(now, 2, 6).move is Move.HOLD
    ctl = _controller()
    now = _feed(ctl, 0.0, ttft_ok=0.6, itl_ok=0.62)  # both fail alike: moving would only shift the pain
    assert ctl.decide(now, 2, 6).move is Move.HOLD


def test_cooldown_minimum_counts_in_flight_moves_and_sample_counts_hold() -> None:
    ctl = _controller()
    now = _feed(ctl, 0.0, ttft_ok=0.5, itl_ok=1.0)
    assert ctl.decide(now, 2, 6).move is Move.TO_PREFILL
    now = _feed(ctl, now, ttft_ok=0.5, itl_ok=1.0)
    held = ctl.decide(now, 3, 5)
    assert held.move is Move.HOLD and held.reason == "cooling down"
    now = _feed(ctl, now + COOLDOWN_S, ttft_ok=0.5, itl_ok=1.0)
    assert ctl.decide(now, 3, 5, moves_in_flight=1).move is Move.HOLD
    assert ctl.decide(now, 7, 1).move is Move.HOLD  # decode is at its minimum
    assert ctl.decide(now, 3, 5).move is Move.TO_PREFILL
    fresh = _controller()
    _feed(fresh, 0.0, ttft_ok=0.0, itl_ok=1.0, n=5)
    assert fresh.decide(1.0, 2, 6).reason == "too few samples"


def test_samples_before_the_last_move_and_outside_the_window_are_forgotten() -> None:
    ctl = _controller()
    now = _feed(ctl, 0.0, ttft_ok=0.5, itl_ok=1.0)
    assert ctl.decide(now, 2, 6).move is Move.TO_PREFILL
    # after the move only good samples come: the old failures must not trigger another move
    now = _feed(ctl, now + COOLDOWN_S, ttft_ok=1.0, itl_ok=1.0)
    decision = ctl.decide(now, 3, 5)
    assert decision.move is Move.HOLD and decision.ttft_attainment == 1.0


def test_ttft_lost_waiting_for_decode_room_counts_against_decode() -> None:
    ctl = _controller()
    for i in range(100):
        ctl.observe_ttft(i / 100, 1.0, decode_wait_s=0.9)  # a 1 s TTFT, 0.9 s of it waiting for decode KV
        ctl.observe_tokens(i / 100, 0.02, count=4)
    decision = ctl.decide(1.0, 2, 6)
    assert decision.move is Move.TO_DECODE and decision.ttft_attainment == 1.0
    late = _controller()
    for i in range(100):  # overdue requests still queued for prefill: prefill's fault, known before any token
        late.observe_late(i / 100, decode_wait_s=0.0)
    assert late.decide(1.0, 2, 6).move is Move.TO_PREFILL


def test_controller_config_is_checked() -> None:
    with pytest.raises(ValueError, match="ttft"):
        ControllerConfig(slo=SLO.parse(["itl:40"]))
    with pytest.raises(ValueError, match="cooldown_s"):
        ControllerConfig(slo=SLO_, cooldown_s=0)


# ---- in the simulator ---------------------------------------------------------------------
# Prefill 0.1 ms per token (a 768-token prompt: 77 ms); decode 10 ms + 1 ms per sequence, so
# the 40 ms ITL objective holds up to 30 sequences per decode instance. On 8 instances at
# 20 rps the prefill-heavy half wants 3 prefill instances and the decode-heavy half (192
# tokens per answer) at least 6 decode instances.
SIM_PROFILE = profile(
    prefill=(2e-3, 1e-4, 0.0),
    decode=(0.01, 0.0, 1e-3),
    max_batched_tokens=4096,
    max_num_seqs=256,
    num_layers=8,
    kv_bytes_per_token=1 << 16,
)
OPTIONS = SimOptions(link=KVLink(), local_prefill=LocalPrefillThresholds(max_local_tokens=0), control_interval_s=0.5)
RATE = 20.0


def _run(specs, prefill: int, controlled: bool):
    ctl = _controller() if controlled else None
    return Simulator(SIM_PROFILE, ClusterSpec.split(prefill, 8 - prefill), OPTIONS).run(specs, ctl)


def _assert_cooldown(moves) -> None:
    times = [m.time_s for m in moves]
    assert all(b - a >= COOLDOWN_S for a, b in itertools.pairwise(times))


def test_on_a_shift_the_controller_moves_to_decode_and_beats_the_fixed_ratio() -> None:
    specs = make_workload("shift", 2400, ArrivalProcess.poisson(RATE), seed=1)
    shift_s = specs[len(specs) // 2].arrival_s
    fixed, controlled = _run(specs, 3, False), _run(specs, 3, True)
    second = fixed.arrival_s >= shift_s
    fixed_att, ctl_att = good_requests(fixed, SLO_)[second].mean(), good_requests(controlled, SLO_)[second].mean()
    assert good_requests(controlled, SLO_)[~second].mean() >= 0.95  # the starting ratio suits the first half
    assert controlled.moves and all(m.move is Move.TO_DECODE for m in controlled.moves)
    assert all(m.time_s > shift_s for m in controlled.moves)  # it held while the first half went well
    assert all(m.decode_attainment < m.ttft_attainment for m in controlled.moves)  # ITL was what failed
    _assert_cooldown(controlled.moves)
    assert fixed_att < 0.5 and ctl_att > fixed_att + 0.3
    assert controlled.roles[-1].num_decode > 5


def test_on_a_steady_prefill_heavy_load_it_moves_to_prefill_once_and_stops() -> None:
    specs = make_workload("prefill-heavy", 1200, ArrivalProcess.poisson(RATE), seed=2)
    controlled = _run(specs, 1, True)  # one prefill instance: TTFT fails
    moves = [m.move for m in controlled.moves]
    assert moves and set(moves) == {Move.TO_PREFILL}  # no flapping back
    assert all(m.ttft_attainment < m.decode_attainment for m in controlled.moves)
    _assert_cooldown(controlled.moves)
    assert controlled.roles[-1].num_prefill >= 3
    good_ratio = _run(specs, 3, True)
    assert good_ratio.moves == []  # a steady load at a good ratio: nothing to do
    assert good_requests(good_ratio, SLO_).mean() > 0.95


def test_on_a_shift_from_too_few_prefill_it_moves_to_prefill_then_to_decode() -> None:
    specs = make_workload("shift", 2400, ArrivalProcess.poisson(RATE), seed=1)
    shift_s = specs[len(specs) // 2].arrival_s
    controlled = _run(specs, 1, True)
    before = [m.move for m in controlled.moves if m.time_s < shift_s]
    after = [m.move for m in controlled.moves if m.time_s >= shift_s]
    assert before and set(before) == {Move.TO_PREFILL}  # TTFT failed first
    assert after and set(after) == {Move.TO_DECODE}  # then ITL
    _assert_cooldown(controlled.moves)
    fixed = _run(specs, 1, False)
    assert good_requests(controlled, SLO_).mean() > good_requests(fixed, SLO_).mean() + 0.5
