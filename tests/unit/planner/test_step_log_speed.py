"""The machine's speed from logged steps: the speed factor of a stretch that ran slower by a known
factor, a speed trace that follows a slow spell, and a jitter fit that recovers the process
the steps were drawn from."""

from __future__ import annotations

import random

import pytest
from planner_helpers import profile

from minipd.ops.planner import step_log_speed
from minipd.ops.planner.step_jitter import SpeedProcess, StepJitter
from minipd.ops.planner.step_log_fit import Step

MODEL = profile(prefill=(0.02, 3e-4, 2e-7), decode=(0.012, 4e-6, 6e-4))


def _decode_steps(n: int, factor_at, start_s: float = 0.0, seed: int = 0) -> list[Step]:
    """Back-to-back decode steps of random batches, each `factor_at(index, start)` times the model."""
    rng, steps, t = random.Random(seed), [], start_s
    for i in range(n):
        ctx = tuple(rng.randrange(20, 400) for _ in range(rng.randrange(1, 9)))
        seconds = MODEL.decode.step_s(sum(ctx), len(ctx)) * factor_at(i, t)
        steps.append(Step(t, seconds, (), (), ctx))
        t += seconds
    return steps


def _prefill_step(t: float, q: int) -> Step:
    return Step(t, MODEL.prefill.step_s(q, float(q * q)), (q,), (q,), ())


def test_a_stretch_that_ran_slower_throughout_has_that_speed_factor():
    steps = _decode_steps(300, lambda i, t: 1.3) + [_prefill_step(100.0, 200)]  # a prefill step is not a decode
    assert step_log_speed.speed_factor(MODEL, steps, "decode") == pytest.approx(1.3, rel=1e-9)
    assert step_log_speed.speed_factor(MODEL, steps, "prefill") == pytest.approx(1.0, rel=1e-9)
    assert step_log_speed.speed_factor(MODEL, [], "decode") == 1.0
    with pytest.raises(ValueError, match="role"):
        step_log_speed.speed_factor(MODEL, steps, "colocated")


def test_a_speed_trace_follows_a_slow_spell_and_lines_up_with_the_origin():
    steps = _decode_steps(4000, lambda i, t: 2.0 if 510.0 <= t < 520.0 else 1.0, start_s=500.0)
    assert steps[-1].start_s > 525.0  # the stretch covers the spell and time after it
    trace = step_log_speed.speed_trace(MODEL, {1: (steps, "decode")}, origin_s=500.0)
    assert set(trace.times) == {1}
    for t, want in ((5.0, 1.0), (15.0, 2.0), (24.0, 1.0)):
        assert trace.level(1, t) == pytest.approx(want, rel=1e-6)
    assert trace.sigma_step[1] < 0.2  # steadily slow or fast: only the steps at the spell's edges stray
    assert step_log_speed.speed_trace(MODEL, {0: (steps, "prefill")}, origin_s=500.0).times == {}  # no prefill steps


def test_the_jitter_fit_recovers_the_process_the_steps_came_from():
    truth = StepJitter(sigma_slow=0.15, tau_s=0.8, sigma_step=0.06, seed=7)
    process = SpeedProcess(truth)
    stretches = [_decode_steps(3000, lambda i, t: process.factor(0, t), start_s=100.0 * k, seed=k) for k in range(4)]
    fitted = step_log_speed.fit_jitter(MODEL, stretches, "decode", seed=2)
    assert fitted.sigma_slow == pytest.approx(truth.sigma_slow, rel=0.25)
    assert fitted.sigma_step == pytest.approx(truth.sigma_step, rel=0.35)
    assert fitted.tau_s == pytest.approx(truth.tau_s, rel=0.4)
    assert fitted.seed == 2


def test_a_stretch_at_a_steady_speed_fits_no_jitter():
    steps = _decode_steps(200, lambda i, t: 1.7)  # slow, but steadily: the speed factor's business
    fitted = step_log_speed.fit_jitter(MODEL, [steps], "decode")
    assert fitted.sigma_slow == pytest.approx(0.0, abs=1e-6) and fitted.sigma_step == pytest.approx(0.0, abs=1e-6)
    assert step_log_speed.fit_jitter(MODEL, [steps[:3]], "decode") == StepJitter()  # too few steps to say
