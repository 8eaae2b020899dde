"""A role's stop deadline (`StopDeadline`, entrypoints/stop_signal.py): before the signal a
step gets the whole bound; from it on, what is left of the bound, shrinking with the time
spent, never below 0."""

from __future__ import annotations

import time

from minipd.entrypoints.stop_signal import StopDeadline


def test_before_the_signal_a_step_gets_the_whole_bound():
    assert StopDeadline(5.0).left_s() == 5.0


def test_after_the_signal_what_is_left_shrinks_and_never_goes_below_zero(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    stop = StopDeadline(2.0)
    stop.start()
    assert stop.left_s() == 2.0
    now[0] += 0.5
    assert stop.left_s() == 1.5
    now[0] += 10.0
    assert stop.left_s() == 0.0
