"""DistServe's motivating example (OSDI'24, Figure 1) as a check vector for the simulator.

A 13B model (OPT-13B in the paper's evaluation) on one A100 80GB per instance, prompts of
512 tokens, outputs of 64, SLOs P90 TTFT 0.4 s and P90 TPOT 0.04 s. The paper measures a
prefill-only instance sustaining 5.6 rps and a decode-only one 10 rps, so 2 prefill : 1
decode serves 10 rps on 3 GPUs (3.3 rps per GPU), against 1.6 rps for one colocated vLLM GPU.

The profile is obtained in two steps (`python -m minipd.ops.planner calibrate-distserve` redoes
the second):
1. the *shape* of each step comes from the roofline of OPT-13B on an A100 (`roofline.py`,
   default efficiencies), with a token budget of 512 (one prompt per prefill step, as in
   the paper's M/D/1 analysis of prefill) and the KV moving over NVLink (300 GB/s one way);
2. each phase's three coefficients are multiplied by one factor, found by bisection in this
   simulator, so that a lone prefill instance's goodput (Poisson arrivals, TTFT only) is
   5.6 rps and a lone decode instance's (Poisson arrivals of prefilled requests, TPOT only)
   is 10 rps: `PREFILL_FACTOR` and `DECODE_FACTOR` below, i.e. the paper's 2023 system ran
   prefill at 1/1.39 and decode at 1/1.56 of the roofline's speed.
Nothing is fitted to the 2P:1D or the colocated figure: the planner predicts both.
"""

from __future__ import annotations

from minipd.ops.planner.calibration import calibrate_phase, scale_phases
from minipd.ops.planner.hardware import A100, OPT_13B
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.roofline import roofline_profile
from minipd.ops.planner.workload_spec import WorkloadSpec
from minipd.slo.targets import SLO

PREFILL_RPS = 5.6  # the paper's prefill-only instance
DECODE_RPS = 10.0  # the paper's decode-only instance
SPLIT_RPS_PER_GPU = 10.0 / 3  # 2 prefill + 1 decode
COLOCATED_RPS_PER_GPU = 1.6  # one colocated vLLM GPU
SLO_TARGETS = SLO(ttft_s=0.4, tpot_s=0.04)
NVLINK_GBPS = 2400.0  # A100 NVLink: 600 GB/s both ways, 300 GB/s = 2400 Gbit/s one way

# From `calibrate()` with CALIBRATION_REQUESTS requests; see the module docstring.
PREFILL_FACTOR = 1.3895
DECODE_FACTOR = 1.5611
CALIBRATION_REQUESTS = 4000


def workload(num_requests: int, seed: int = 0) -> WorkloadSpec:
    return WorkloadSpec(
        name="prefill-heavy", prompt_len="fixed:512", output_len="fixed:64", num_requests=num_requests, seed=seed
    )


def base_profile() -> LatencyProfile:
    """Step 1: the roofline shape, before calibration."""
    return roofline_profile("distserve-13b-a100", OPT_13B, A100, dtype="float16", max_batched_tokens=512).replace(
        link_gbps=NVLINK_GBPS, link_setup_s=0.0
    )


def profile() -> LatencyProfile:
    return scale_phases(base_profile(), PREFILL_FACTOR, DECODE_FACTOR).replace(
        source="calibrated",
        notes=f"OPT-13B roofline on A100 with prefill x{PREFILL_FACTOR} and decode x{DECODE_FACTOR}, calibrated "
        f"to DistServe Figure 1 ({PREFILL_RPS} rps prefill-only, {DECODE_RPS} rps decode-only); "
        "see minipd.ops.planner.experiments.distserve_example",
    )


def calibrate(num_requests: int = CALIBRATION_REQUESTS) -> tuple[float, float]:
    """Step 2 again: (prefill factor, decode factor). Takes a few minutes."""
    base, spec = base_profile(), workload(num_requests)
    calibrated, prefill_factor = calibrate_phase(base, "prefill", PREFILL_RPS, spec, SLO_TARGETS)
    _, decode_factor = calibrate_phase(calibrated, "decode", DECODE_RPS, spec, SLO_TARGETS)
    return prefill_factor, decode_factor
