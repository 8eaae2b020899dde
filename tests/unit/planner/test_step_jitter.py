"""Step-time jitter and speed traces in the simulator: the factor process keeps the mean and has
the correlation asked for, no jitter changes nothing, jitter widens the tails, a speed trace
scales exactly the steps it covers, and bad parameters are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from planner_helpers import profile

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.simulator import Simulator
from minipd.ops.planner.step_jitter import SpeedProcess, SpeedTrace, StepJitter, TracedSpeed
from minipd.ops.workload import ArrivalProcess, LengthDist, make_workload
from minipd.policy.local_prefill import LocalPrefillThresholds

NO_LOCAL = dict(link=KVLink(), local_prefill=LocalPrefillThresholds(max_local_tokens=0))
MODEL = profile(prefill=(0.02, 2e-4, 0.0), decode=(0.01, 1e-6, 5e-4))


def _factors(jitter: StepJitter, dt: float, n: int, index: int = 0) -> np.ndarray:
    process = SpeedProcess(jitter)
    return np.array([process.factor(index, i * dt) for i in range(n)])


def test_the_factors_keep_the_mean_and_decorrelate_over_the_correlation_time():
    jitter = StepJitter(sigma_slow=0.2, tau_s=0.5, sigma_step=0.0, seed=3)
    dt = 0.05
    factors = _factors(jitter, dt, 200_000)
    assert factors.mean() == pytest.approx(1.0, abs=0.01)  # the profile's mean step time is kept
    x = np.log(factors) - np.log(factors).mean()
    assert x.std() == pytest.approx(0.2, rel=0.05)
    for lag in (1, 10):
        rho = float(np.mean(x[:-lag] * x[lag:]) / np.mean(x * x))
        assert rho == pytest.approx(math.exp(-lag * dt / jitter.tau_s), abs=0.03)


def test_per_step_noise_is_uncorrelated_and_each_instance_has_its_own_process():
    jitter = StepJitter(sigma_slow=0.0, sigma_step=0.1, seed=5)
    a, b = _factors(jitter, 0.02, 50_000, index=0), _factors(jitter, 0.02, 50_000, index=1)
    x = np.log(a) - np.log(a).mean()
    assert abs(float(np.mean(x[:-1] * x[1:]) / np.mean(x * x))) < 0.03
    assert abs(float(np.corrcoef(np.log(a), np.log(b))[0, 1])) < 0.03
    np.testing.assert_array_equal(a, _factors(jitter, 0.02, 50_000, index=0))  # reproducible by seed


def _workload(n: int = 400):
    return make_workload(
        "prefill-heavy",
        n,
        ArrivalProcess.poisson(8.0),
        seed=2,
        prompt_len=LengthDist.uniform(32, 128),
        output_len=LengthDist.uniform(8, 32),
    )


def _lone_requests():
    fixed = LengthDist.fixed
    return make_workload(
        "prefill-heavy", 6, ArrivalProcess.poisson(0.5), seed=1, prompt_len=fixed(64), output_len=fixed(5)
    )


def test_zero_jitter_changes_nothing_and_jitter_widens_the_tails():
    specs = _workload()
    plain = Simulator(MODEL, ClusterSpec.split(1, 1), SimOptions(**NO_LOCAL)).run(specs)
    zero = SimOptions(**NO_LOCAL, prefill_jitter=StepJitter(), decode_jitter=StepJitter())
    same = Simulator(MODEL, ClusterSpec.split(1, 1), zero).run(specs)
    np.testing.assert_array_equal(same.ttft_s, plain.ttft_s)
    np.testing.assert_array_equal(same.tpot_s, plain.tpot_s)
    noisy = StepJitter(sigma_slow=0.25, tau_s=0.5, sigma_step=0.1, seed=1)
    jittered = Simulator(
        MODEL, ClusterSpec.split(1, 1), SimOptions(**NO_LOCAL, prefill_jitter=noisy, decode_jitter=noisy)
    ).run(specs)

    def spread(gaps):
        return gaps.percentile(90) / gaps.percentile(50)

    assert spread(jittered.itl_gaps) > spread(plain.itl_gaps) * 1.1
    assert np.std(jittered.tpot_s) > np.std(plain.tpot_s) * 1.5


def test_a_speed_trace_scales_exactly_the_steps_of_the_instances_it_lists():
    specs = _lone_requests()  # far apart: each request alone, so every latency is its steps
    plain = Simulator(MODEL, ClusterSpec.split(1, 1), SimOptions(**NO_LOCAL)).run(specs)
    slow_decode = SpeedTrace(times={1: (0.0,)}, factors={1: (2.0,)})  # index 1: the decode instance
    traced = Simulator(MODEL, ClusterSpec.split(1, 1), SimOptions(**NO_LOCAL, speed_trace=slow_decode)).run(specs)
    np.testing.assert_allclose(traced.ttft_s, plain.ttft_s, rtol=1e-12)  # prefill untouched
    np.testing.assert_allclose(traced.tpot_s, 2 * plain.tpot_s, rtol=1e-9)
    slow_prefill = SpeedTrace(times={0: (0.0,)}, factors={0: (3.0,)})
    traced = Simulator(MODEL, ClusterSpec.split(1, 1), SimOptions(**NO_LOCAL, speed_trace=slow_prefill)).run(specs)
    np.testing.assert_allclose(traced.ttft_s, 3 * plain.ttft_s, rtol=1e-9)


def test_a_trace_takes_the_factor_of_the_last_point_at_or_before_the_step():
    trace = SpeedTrace(times={0: (1.0, 2.0)}, factors={0: (1.5, 0.5)})
    speed = TracedSpeed(trace)
    assert [speed.factor(0, t) for t in (0.0, 1.0, 1.99, 2.0, 9.0)] == [1.5, 1.5, 1.5, 0.5, 0.5]
    assert speed.factor(7, 1.0) == 1.0  # not listed: the profile's speed


def test_a_traces_per_step_spread_keeps_its_level_on_average():
    trace = SpeedTrace(times={0: (0.0, 10.0)}, factors={0: (1.0, 2.0)}, sigma_step={0: 0.2}, seed=4)
    speed = TracedSpeed(trace)
    early = np.array([speed.factor(0, 5.0) for _ in range(40_000)])
    late = np.array([speed.factor(0, 15.0) for _ in range(40_000)])
    assert early.mean() == pytest.approx(1.0, rel=0.01) and late.mean() == pytest.approx(2.0, rel=0.01)
    assert np.log(early).std() == pytest.approx(0.2, rel=0.03)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: StepJitter(sigma_slow=-0.1), "sigma_slow"),
        (lambda: StepJitter(sigma_step=math.nan), "sigma_step"),
        (lambda: StepJitter(tau_s=0.0), "tau_s"),
        (lambda: SpeedTrace(times={0: (0.0, 1.0)}, factors={0: (1.0,)}), "as many factors"),
        (lambda: SpeedTrace(times={0: (1.0, 0.0)}, factors={0: (1.0, 1.0)}), "ascend"),
        (lambda: SpeedTrace(times={0: (0.0,)}, factors={0: (0.0,)}), "positive"),
        (lambda: SpeedTrace(times={0: (0.0,)}, factors={1: (1.0,)}), "same instances"),
        (lambda: SpeedTrace(times={0: (0.0,)}, factors={0: (1.0,)}, sigma_step={1: 0.1}), "same instances"),
        (lambda: SpeedTrace(times={0: (0.0,)}, factors={0: (1.0,)}, sigma_step={0: -1.0}), "sigma_step"),
        (
            lambda: SimOptions(speed_trace=SpeedTrace(times={}, factors={}), decode_jitter=StepJitter()),
            "one or the other",
        ),
    ],
)
def test_bad_jitter_and_trace_parameters_are_refused_by_name(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_a_decode_join_delay_adds_to_the_first_gap_only():
    specs = _lone_requests()  # alone on the cluster: the first gap is one decode step, plus the hop
    plain = Simulator(MODEL, ClusterSpec.split(1, 1), SimOptions(**NO_LOCAL)).run(specs)
    delay = 0.004
    hop = Simulator(MODEL, ClusterSpec.split(1, 1), SimOptions(**NO_LOCAL, decode_join_delay_s=delay)).run(specs)
    np.testing.assert_allclose(hop.ttft_s, plain.ttft_s, rtol=0, atol=1e-12)  # the first token counts at landing
    np.testing.assert_allclose(hop.tpot_s, plain.tpot_s + delay / 4, rtol=0, atol=1e-12)  # 4 gaps, one longer
    with pytest.raises(ValueError, match="decode_join_delay_s"):
        SimOptions(decode_join_delay_s=-0.001)
