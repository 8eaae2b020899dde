"""The simulator against queueing theory and its own bookkeeping: M/D/1 waiting times, every
request completing with consistent latencies, and a decode pool short of KV queueing
requests instead of over-admitting them."""

from __future__ import annotations

import numpy as np
import pytest
from planner_helpers import profile

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.sim_summary import summarize_sim
from minipd.ops.planner.simulator import Simulator
from minipd.ops.workload import ArrivalProcess, LengthDist, make_workload
from minipd.policy.local_prefill import LocalPrefillThresholds
from minipd.slo.targets import SLO

SERVICE_S = 0.05
NO_LOCAL = SimOptions(link=KVLink(), local_prefill=LocalPrefillThresholds(max_local_tokens=0))


@pytest.mark.parametrize("rho", [0.5, 0.65, 0.8])
def test_one_prefill_instance_with_constant_service_is_an_md1_queue(rho: float) -> None:
    # batch size 1, a step of constant length D, Poisson arrivals, free decode, no link:
    # mean TTFT = D + rho D / (2 (1 - rho)) (Pollaczek-Khinchine for deterministic service)
    md1 = profile(prefill=(SERVICE_S, 0.0, 0.0), max_num_seqs=1)
    specs = make_workload(
        "prefill-heavy",
        30_000,
        ArrivalProcess.poisson(rho / SERVICE_S),
        seed=3,
        prompt_len=LengthDist.fixed(100),
        output_len=LengthDist.fixed(1),
    )
    result = Simulator(md1, ClusterSpec.split(1, 1), NO_LOCAL).run(specs)
    expected = SERVICE_S + rho * SERVICE_S / (2 * (1 - rho))
    assert result.ttft_s.mean() == pytest.approx(expected, rel=0.05)
    assert result.ttft_s.min() == pytest.approx(SERVICE_S)  # nobody is served faster than D


def test_a_fixed_request_overhead_delays_admission_and_adds_to_every_ttft() -> None:
    # The overhead is before admission: it shifts every arrival alike, so the queue is the
    # same and each TTFT (counted from the arrival) grows by exactly the overhead.
    md1 = profile(prefill=(SERVICE_S, 0.0, 0.0), decode=(0.01, 0.0, 0.0), max_num_seqs=1)
    specs = make_workload(
        "prefill-heavy",
        2_000,
        ArrivalProcess.poisson(0.7 / SERVICE_S),
        seed=4,
        prompt_len=LengthDist.fixed(100),
        output_len=LengthDist.fixed(4),
    )
    overhead = 0.008
    plain = Simulator(md1, ClusterSpec.split(1, 1), NO_LOCAL).run(specs)
    shifted = SimOptions(link=KVLink(), local_prefill=NO_LOCAL.local_prefill, request_overhead_s=overhead)
    late = Simulator(md1, ClusterSpec.split(1, 1), shifted).run(specs)
    np.testing.assert_allclose(late.ttft_s, plain.ttft_s + overhead, rtol=0, atol=1e-9)
    np.testing.assert_allclose(late.tpot_s, plain.tpot_s, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="request_overhead_s"):
        SimOptions(request_overhead_s=-1.0)


@pytest.mark.parametrize(
    "cluster", [ClusterSpec.split(2, 2), ClusterSpec.colocated(3), ClusterSpec.split(0, 2)], ids=lambda c: c.label
)
def test_every_request_completes_with_consistent_latencies(cluster: ClusterSpec) -> None:
    p = profile(
        prefill=(2e-3, 3e-5, 1e-9),
        decode=(8e-3, 5e-8, 2e-5),
        max_batched_tokens=1024,
        max_num_seqs=32,
        kv_capacity_tokens=40_000,
        num_layers=8,
        kv_bytes_per_token=1 << 17,
        link_gbps=100.0,
    )
    specs = make_workload("mixed", 600, ArrivalProcess.poisson(40.0), seed=5)
    result = Simulator(p, cluster).run(specs)
    assert np.all(np.isfinite(result.e2e_s)) and np.all(result.ttft_s > 0)
    assert np.all(result.ttft_s <= result.e2e_s + 1e-12)
    multi = result.output_len > 1
    # TPOT is the mean gap, so the gaps after the first token add up to E2E - TTFT
    np.testing.assert_allclose(
        result.tpot_s[multi] * (result.output_len[multi] - 1),
        (result.e2e_s - result.ttft_s)[multi],
        rtol=1e-9,
        atol=1e-12,
    )
    assert np.all(result.itl_max_s[multi] >= result.itl_p90_s[multi])
    assert np.all(result.itl_p90_s[multi] >= 0)
    assert result.itl_gaps.count == int((result.output_len - 1).sum())
    assert all(0 < peak <= p.kv_capacity_tokens for peak in result.peak_kv_used.values())


def test_a_decode_pool_short_of_kv_queues_requests_rather_than_over_admitting() -> None:
    prompt, output = 500, 100
    capacity = 4 * (prompt + output)  # four requests at a time
    base = {"prefill": (1e-3, 1e-5, 0.0), "decode": (5e-3, 1e-8, 1e-4), "num_layers": 4, "kv_bytes_per_token": 1024}
    specs = make_workload(
        "prefill-heavy",
        300,
        ArrivalProcess.poisson(20.0),
        seed=2,
        prompt_len=LengthDist.fixed(prompt),
        output_len=LengthDist.fixed(output),
    )
    small = Simulator(profile(kv_capacity_tokens=capacity, **base), ClusterSpec.split(1, 1), NO_LOCAL).run(specs)
    large = Simulator(profile(kv_capacity_tokens=100 * capacity, **base), ClusterSpec.split(1, 1), NO_LOCAL).run(specs)
    assert np.all(np.isfinite(small.e2e_s))  # every request completes
    assert small.peak_kv_used[1] <= capacity  # never more admitted than fits
    assert large.peak_kv_used[1] > capacity  # the load does want more than four at a time
    assert small.num_admission_waits > 0 and large.num_admission_waits == 0
    # the wait shows as TTFT, not as inter-token latency
    assert np.mean(small.ttft_s) > 5 * np.mean(large.ttft_s)
    assert np.median(small.tpot_s) <= 1.05 * np.median(large.tpot_s)


def test_a_request_larger_than_an_instances_kv_is_refused_up_front() -> None:
    specs = make_workload(
        "prefill-heavy",
        3,
        ArrivalProcess.poisson(1.0),
        prompt_len=LengthDist.fixed(900),
        output_len=LengthDist.fixed(200),
    )
    with pytest.raises(ValueError, match="needs 1100 tokens of KV"):
        Simulator(profile(kv_capacity_tokens=1000), ClusterSpec.split(1, 1)).run(specs)


def test_slo_attainment_and_good_rps_count_only_requests_meeting_every_objective() -> None:
    p = profile(prefill=(0.01, 0.0, 0.0), decode=(0.02, 0.0, 0.0))
    specs = make_workload(
        "prefill-heavy",
        200,
        ArrivalProcess.poisson(5.0),
        seed=1,
        prompt_len=LengthDist.fixed(64),
        output_len=LengthDist.fixed(10),
    )
    result = Simulator(p, ClusterSpec.split(1, 1), NO_LOCAL).run(specs)
    loose = summarize_sim(result, SLO.parse(["ttft:1000", "tpot:1000"]))
    assert loose.attainment == 1.0 and loose.good_rps == pytest.approx(loose.throughput_rps)
    # every decode step takes 20 ms, so a 15 ms TPOT objective fails everyone, whatever the TTFT
    tight = summarize_sim(result, SLO.parse(["ttft:1000", "tpot:15"]))
    assert tight.attainment == 0.0 and tight.good_rps == 0.0
    # most gaps are one 20 ms step; the first can be longer (the KV lands mid-step and joins
    # at the next one), which lifts the mean a little
    assert loose.itl_s.p50 == pytest.approx(0.02, rel=0.01)
    assert 0.02 <= loose.tpot_s.p50 <= 0.02 * 1.1
    assert summarize_sim(result, SLO.parse(["ttft:9"])).attainment == 0.0  # every TTFT is at least one 10 ms step
