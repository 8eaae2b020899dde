"""The pool-scaling policy, pure: each rule, each bound, the cool-down, the idle clock."""

from __future__ import annotations

import math

import pytest

from minipd.policy.scale_policy import (
    DECODE,
    PREFILL,
    IdleClock,
    PoolState,
    ScaleAction,
    ScaleConfig,
    ScaleInput,
    ScalePolicy,
    decide_scale,
    wanted_role,
)


def _inputs(now=100.0, prefill=(4, 0, 0.0), decode=(4, 0, 0.0), wanted=None, switch=False, free=2) -> ScaleInput:
    return ScaleInput(now, PoolState(*prefill), PoolState(*decode), wanted, switch, free)


def test_a_wanted_role_is_added_when_there_is_room_else_switched_in_mode_both() -> None:
    both = ScaleConfig(mode="both")
    added = decide_scale(_inputs(wanted=PREFILL, switch=True, free=1), both)
    assert (added.action, added.role) == (ScaleAction.ADD, PREFILL)
    switched = decide_scale(_inputs(wanted=DECODE, switch=True, free=0), both)
    assert (switched.action, switched.role) == (ScaleAction.SWITCH, DECODE)
    # no room and the controller did not ask to move (it held: both sides short): nothing
    held = decide_scale(_inputs(wanted=DECODE, switch=False, free=0), both)
    assert held.action is ScaleAction.NONE and held.reason == "decode wanted: no room to add and no move asked"


def test_modes_limit_the_actions() -> None:
    scale_only, switch_only = ScaleConfig(mode="scale"), ScaleConfig(mode="switch")
    assert decide_scale(_inputs(wanted=PREFILL, switch=True, free=0), scale_only).action is ScaleAction.NONE
    assert decide_scale(_inputs(wanted=PREFILL, switch=True, free=5), switch_only).action is ScaleAction.SWITCH
    idle = _inputs(decode=(4, 0, 1000.0))
    assert decide_scale(idle, switch_only).action is ScaleAction.NONE  # a fixed-size cluster never removes
    assert decide_scale(idle, scale_only).action is ScaleAction.REMOVE
    with pytest.raises(ValueError, match="scale mode"):
        ScaleConfig(mode="grow")


def test_bounds_stop_adds_switches_and_removes() -> None:
    config = ScaleConfig(mode="both", max_prefill=5, min_decode=3, idle_window_s=10.0)
    # prefill at 4 serving + 1 starting = its maximum: no add, no switch into it
    at_max = decide_scale(_inputs(prefill=(4, 1, 0.0), wanted=PREFILL, switch=True, free=3), config)
    assert at_max.action is ScaleAction.NONE and at_max.reason == "prefill wanted: prefill at its maximum"
    # no room, and decode would fall under its minimum of 3
    at_min = decide_scale(_inputs(decode=(3, 0, 0.0), wanted=PREFILL, switch=True, free=0), config)
    assert (
        at_min.action is ScaleAction.NONE
        and at_min.reason == "prefill wanted: no room to add and decode at its minimum"
    )
    idle_at_min = decide_scale(_inputs(decode=(3, 0, 50.0)), config)
    assert idle_at_min.action is ScaleAction.NONE
    with pytest.raises(ValueError, match="max_decode"):
        ScaleConfig(min_decode=4, max_decode=3)
    with pytest.raises(ValueError, match="min_decode"):
        ScaleConfig(min_decode=0)


def test_an_idle_pool_loses_an_instance_after_the_window_never_the_wanted_role() -> None:
    config = ScaleConfig(mode="scale", idle_window_s=10.0)
    assert decide_scale(_inputs(decode=(4, 0, 9.9)), config).action is ScaleAction.NONE
    removed = decide_scale(_inputs(prefill=(4, 0, 12.0), decode=(4, 0, 30.0)), config)
    assert (removed.action, removed.role) == (ScaleAction.REMOVE, DECODE)  # the longer idle
    # decode is wanted but there is no room: the idle prefill pool makes room
    room = decide_scale(_inputs(prefill=(4, 0, 12.0), decode=(4, 0, 30.0), wanted=DECODE, free=0), config)
    assert (room.action, room.role) == (ScaleAction.REMOVE, PREFILL)
    # nothing is removed while the cluster grows: an add within the idle window blocks it
    assert decide_scale(_inputs(decode=(4, 0, 30.0)), config, last_add_s=95.0).action is ScaleAction.NONE
    assert decide_scale(_inputs(decode=(4, 0, 30.0)), config, last_add_s=85.0).action is ScaleAction.REMOVE


def test_the_policy_cools_down_after_any_action() -> None:
    policy = ScalePolicy(ScaleConfig(mode="both", cooldown_s=5.0, idle_window_s=0.0))
    assert policy.decide(_inputs(now=10.0, wanted=PREFILL, free=1)).action is ScaleAction.ADD
    cooling = policy.decide(_inputs(now=14.0, wanted=PREFILL, free=1))
    assert cooling.action is ScaleAction.NONE and cooling.cause == "cooldown"
    assert policy.decide(_inputs(now=15.0, wanted=PREFILL, free=1)).action is ScaleAction.ADD
    assert [d.time_s for d in policy.decisions] == [10.0, 15.0]
    assert policy.last_add_s == 15.0


def test_wanted_role_follows_the_move_else_the_short_side() -> None:
    assert wanted_role("decode", 0.2, 1.0, 0.85) == "decode"  # the controller's move wins
    assert wanted_role(None, 0.5, 0.7, 0.85) == "prefill"  # both short: the lower
    assert wanted_role(None, 0.95, 0.7, 0.85) == "decode"
    assert wanted_role(None, 0.9, math.nan, 0.85) is None  # nothing short, decode not measured
    with pytest.raises(ValueError, match="wanted_role"):
        decide_scale(_inputs(wanted="colocated"), ScaleConfig())


def test_the_idle_clock_counts_from_the_first_idle_sample_and_restarts_on_load_or_resize() -> None:
    clock = IdleClock(threshold=0.5)
    clock.observe(0.0, 0.2, 4)  # 0.2 spread over 3 instances: 0.27 < 0.5
    clock.observe(5.0, 0.3, 4)  # 0.4
    assert clock.idle_s(6.0) == 6.0
    clock.observe(7.0, 0.45, 4)  # 0.6 over three: not idle
    assert clock.idle_s(8.0) == 0.0
    clock.observe(9.0, 0.1, 4)
    clock.observe(10.0, 0.1, 3)  # resized: the streak restarts here
    assert clock.idle_s(12.0) == 2.0
    clock.observe(13.0, 0.0, 1)  # one instance: never idle
    assert clock.idle_s(20.0) == 0.0
    with pytest.raises(ValueError, match="threshold"):
        IdleClock(0.0)
