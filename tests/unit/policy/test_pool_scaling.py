"""The pool scaling policy (minipd/policy/pool_scaling.py): adds when the ratio controller
wants an instance and the cluster has room, switches when it has none, removes after the idle
window above the minimum, never below the minimum nor above the maximum, and keeps its
cool-down; and the bounds refuse what makes no sense, naming the field."""

from __future__ import annotations

import pytest

from minipd.policy.pool_scaling import DECODE as D
from minipd.policy.pool_scaling import PREFILL as P
from minipd.policy.pool_scaling import PoolBounds, PoolScaler, ScaleAction, ScalingConfig, wanted
from minipd.policy.ratio_controller import (
    CAUSE_COOLDOWN,
    CAUSE_DECODE,
    CAUSE_DECODE_AT_MIN,
    CAUSE_TTFT,
    CAUSE_TTFT_AT_MIN,
    Decision,
    Move,
)

IDLE_S, COOLDOWN_S = 10.0, 5.0


def scaler(min_p=1, max_p=3, min_d=1, max_d=3, cooldown_s=COOLDOWN_S) -> PoolScaler:
    bounds = PoolBounds(min_prefill=min_p, max_prefill=max_p, min_decode=min_d, max_decode=max_d)
    return PoolScaler(ScalingConfig(bounds=bounds, idle_window_s=IDLE_S, cooldown_s=cooldown_s))


def sizes(prefill: int, decode: int) -> dict[str, int]:
    return {P: prefill, D: decode}


def decision(move: Move, cause: str) -> Decision:
    return Decision(0.0, move, "", 0.5, 0.5, cause)


@pytest.mark.parametrize(
    "move, cause, expected",
    [
        (Move.TO_PREFILL, CAUSE_TTFT, (P, True)),
        (Move.TO_DECODE, CAUSE_DECODE, (D, True)),
        (Move.HOLD, CAUSE_TTFT_AT_MIN, (P, False)),  # no decode to spare: only an add can help
        (Move.HOLD, CAUSE_DECODE_AT_MIN, (D, False)),
        (Move.HOLD, CAUSE_COOLDOWN, (None, False)),
    ],
)
def test_the_role_a_ratio_decision_wants(move, cause, expected):
    assert wanted(decision(move, cause)) == expected


def test_adds_when_wanted_and_the_cluster_has_room():
    choice = scaler().grow(0.0, D, True, sizes(1, 1), room=True)
    assert (choice.action, choice.role) == (ScaleAction.ADD, D)


def test_switches_when_the_cluster_has_no_room():
    choice = scaler().grow(0.0, D, True, sizes(2, 1), room=False)
    assert (choice.action, choice.role) == (ScaleAction.SWITCH, D)


def test_holds_without_room_when_the_other_pool_is_at_its_minimum():
    choice = scaler().grow(0.0, P, False, sizes(1, 1), room=False)
    assert choice.action is ScaleAction.HOLD and "minimum" in choice.reason


def test_never_grows_a_pool_past_its_maximum_by_add_or_switch():
    policy = scaler(max_d=2)
    for room in (True, False):
        choice = policy.grow(0.0, D, True, sizes(2, 2), room=room)
        assert choice.action is ScaleAction.HOLD and "maximum" in choice.reason


def test_a_switch_is_no_scale_event_but_an_add_starts_the_cool_down():
    policy = scaler()
    assert policy.grow(0.0, D, True, sizes(2, 1), room=False).action is ScaleAction.SWITCH
    assert policy.grow(0.1, D, True, sizes(2, 1), room=True).action is ScaleAction.ADD  # no cool-down from a switch
    held = policy.grow(0.1 + COOLDOWN_S / 2, P, True, sizes(2, 2), room=True)
    assert held.action is ScaleAction.HOLD and "cooling down" in held.reason
    assert policy.grow(0.1 + COOLDOWN_S, P, True, sizes(2, 2), room=True).action is ScaleAction.ADD


def test_removes_after_the_idle_window_above_the_minimum():
    policy = scaler()
    policy.observe(0.0, {P: True, D: False})
    assert policy.shrink(IDLE_S - 0.1, sizes(2, 2)).action is ScaleAction.HOLD  # not idle long enough
    choice = policy.shrink(IDLE_S, sizes(2, 2))
    assert (choice.action, choice.role) == (ScaleAction.REMOVE, D)  # prefill is busy


def test_a_request_restarts_the_idle_window():
    policy = scaler()
    policy.observe(0.0, {P: False, D: False})
    policy.observe(IDLE_S - 1, {P: True, D: True})
    policy.observe(IDLE_S - 0.5, {P: False, D: False})
    assert policy.shrink(IDLE_S + 1, sizes(2, 2)).action is ScaleAction.HOLD
    assert policy.shrink(2 * IDLE_S - 0.5, sizes(2, 2)).action is ScaleAction.REMOVE


def test_never_removes_below_the_minimum():
    policy = scaler(min_p=1, min_d=2)
    policy.observe(0.0, {P: False, D: False})
    for now in (IDLE_S, 3 * IDLE_S, 10 * IDLE_S):
        assert policy.shrink(now, sizes(1, 2)).action is ScaleAction.HOLD


def test_one_removal_per_idle_window_and_the_cool_down_between():
    policy = scaler(cooldown_s=IDLE_S / 2)
    policy.observe(0.0, {P: False, D: False})
    first = policy.shrink(IDLE_S, sizes(3, 3))
    assert (first.action, first.role) == (ScaleAction.REMOVE, D)
    # the prefill pool was idle past the window too, but the cool-down holds it back
    assert policy.shrink(IDLE_S + 0.1, sizes(3, 2)).action is ScaleAction.HOLD
    second = policy.shrink(IDLE_S + IDLE_S / 2, sizes(3, 2))
    assert (second.action, second.role) == (ScaleAction.REMOVE, P)
    # decode counts a whole window again from its removal
    assert policy.shrink(2 * IDLE_S - 0.1, sizes(2, 2)).action is ScaleAction.HOLD
    third = policy.shrink(2 * IDLE_S, sizes(2, 2))
    assert (third.action, third.role) == (ScaleAction.REMOVE, D)


def test_an_add_that_finishes_late_gets_a_whole_idle_window_and_cool_down():
    policy = scaler()
    policy.observe(0.0, {P: False, D: False})
    assert policy.grow(0.0, D, False, sizes(1, 1), room=True).action is ScaleAction.ADD
    policy.done(3 * IDLE_S, D)  # the new instance took long to start
    assert policy.shrink(3 * IDLE_S + COOLDOWN_S, sizes(1, 2)).action is ScaleAction.HOLD
    assert policy.shrink(4 * IDLE_S, sizes(1, 2)).action is ScaleAction.REMOVE


@pytest.mark.parametrize(
    "bounds, problem",
    [
        ({"min_prefill": -1}, "min_prefill: must be >= 0"),
        ({"min_decode": 3, "max_decode": 2}, "max_decode: must be >= min_decode (3), got 2"),
        ({"min_prefill": 2, "max_prefill": 1}, "max_prefill: must be >= min_prefill (2)"),
    ],
)
def test_bounds_out_of_order_are_refused_naming_the_field(bounds, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        PoolBounds(**bounds)


@pytest.mark.parametrize(
    "config, problem",
    [({"idle_window_s": 0}, "scale_idle_window_s: must be positive"), ({"cooldown_s": -1}, "scale_cooldown_s")],
)
def test_windows_are_checked_naming_the_flag(config, problem):
    with pytest.raises(ValueError, match=problem):
        ScalingConfig(**config)
