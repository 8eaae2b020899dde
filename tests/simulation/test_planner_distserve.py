"""DistServe's motivating example (OSDI'24, Figure 1) as a check vector.

13B model, one A100 per instance, 512-token prompts, 64-token outputs, P90 TTFT 0.4 s and
P90 TPOT 0.04 s. The profile is the A100 roofline of OPT-13B with one factor per phase,
calibrated so that a lone prefill instance sustains the paper's 5.6 rps and a lone decode
instance its 10 rps (`minipd.ops.planner.experiments.distserve_example`). The planner then has to find, on
three instances, 2 prefill : 1 decode at about 3.3 rps per GPU and the colocated figure of
about 1.6 rps per GPU, neither of which the calibration saw.

Tolerances: the calibrated per-instance rates within 5% (they are the calibration's own
targets, re-measured on a shorter run than the calibration used); the predicted split
within 10% of 10/3; the predicted colocated figure within 12% of 1.6 (measured: 1.76 for
three colocated instances; one alone gives 1.25, so the paper's single-GPU 1.6 sits between).
"""

from __future__ import annotations

import pytest

from minipd.ops.planner.calibration import pool_goodput
from minipd.ops.planner.experiments import distserve_example as ds
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.planner import PlanConfig, plan

NUM_REQUESTS = 1500


@pytest.fixture(scope="module")
def profile():
    return ds.profile()


def test_lone_instances_sustain_the_papers_rates(profile) -> None:
    workload = ds.workload(NUM_REQUESTS)
    assert pool_goodput(profile, "prefill", workload, ds.SLO_TARGETS) == pytest.approx(ds.PREFILL_RPS, rel=0.05)
    assert pool_goodput(profile, "decode", workload, ds.SLO_TARGETS) == pytest.approx(ds.DECODE_RPS, rel=0.05)


def test_planner_picks_two_prefill_one_decode_over_colocated(profile) -> None:
    config = PlanConfig(
        profile=profile,
        num_instances=3,
        workload=ds.workload(NUM_REQUESTS),
        slo=ds.SLO_TARGETS,
        link=KVLink(profile.link_gbps, profile.link_setup_s, True, profile.num_layers),
    )
    result = plan(config)
    splits = {s.label: s for s in result.splits}
    assert set(splits) == {"colocated x3", "1P:2D", "2P:1D"}
    assert result.best == "2P:1D"
    assert splits["2P:1D"].goodput_per_instance == pytest.approx(ds.SPLIT_RPS_PER_GPU, rel=0.10)
    assert splits["colocated x3"].goodput_per_instance == pytest.approx(ds.COLOCATED_RPS_PER_GPU, rel=0.12)
    # 1P:2D is prefill-bound: one prefill instance's 5.6 rps over three GPUs
    assert splits["1P:2D"].goodput_per_instance == pytest.approx(ds.PREFILL_RPS / 3, rel=0.10)
    # at the evaluated rate (0.9 of 10 rps) only the winner is in the green zone
    assert splits["2P:1D"].meets_slo and not splits["colocated x3"].meets_slo and not splits["1P:2D"].meets_slo
    assert splits["2P:1D"].eval.ttft_s.p90 <= 0.4 and splits["2P:1D"].eval.tpot_s.p90 <= 0.04
