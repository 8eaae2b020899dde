"""The KV link: transfer time is bytes over bandwidth, layer-wise streaming hides all but one
layer's share (or what the compute cannot cover), and transfers queue on a busy link."""

from __future__ import annotations

import pytest
from planner_helpers import profile

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.simulator import Simulator
from minipd.ops.workload import RequestSpec
from minipd.policy.local_prefill import LocalPrefillThresholds

COMPUTE_S = 0.1  # the prefill step of one prompt
LAYERS = 10
PROMPT = 1000
BYTES_PER_TOKEN = 1_000_000  # so one prompt's KV is 1 GB = 8 Gbit
SETUP_S = 0.002
GBPS = 100.0  # 8 Gbit in 80 ms: less than the compute


def _ttft(gbps: float, layerwise: bool, specs: list[RequestSpec] | None = None) -> list[float]:
    p = profile(
        prefill=(COMPUTE_S, 0.0, 0.0),
        decode=(0.01, 0.0, 0.0),
        num_layers=LAYERS,
        kv_bytes_per_token=BYTES_PER_TOKEN,
        max_num_seqs=1,
    )
    options = SimOptions(
        link=KVLink(gbps, SETUP_S, layerwise, LAYERS), local_prefill=LocalPrefillThresholds(max_local_tokens=0)
    )
    specs = specs or [RequestSpec(10.0 * i, PROMPT, 4) for i in range(5)]  # far apart: no queueing
    return list(Simulator(p, ClusterSpec.split(1, 1), options).run(specs).ttft_s)


def _transfer_s(gbps: float) -> float:
    return PROMPT * BYTES_PER_TOKEN * 8 / (gbps * 1e9)


def test_layerwise_streaming_exposes_one_layer_when_the_link_keeps_up() -> None:
    t = _transfer_s(GBPS)
    assert t < COMPUTE_S
    for ttft in _ttft(GBPS, layerwise=True):
        assert ttft == pytest.approx(COMPUTE_S + t / LAYERS + SETUP_S, abs=1e-9)


def test_halving_the_bandwidth_raises_ttft_by_the_predicted_transfer_time() -> None:
    full, half = _transfer_s(GBPS), _transfer_s(GBPS / 2)
    assert half > COMPUTE_S  # now the link cannot keep up with the compute
    # layer-wise: exposed was one layer's share; now it is what the compute cannot hide
    exposed_full = full / LAYERS
    exposed_half = half - COMPUTE_S * (LAYERS - 1) / LAYERS
    rise = [b - a for a, b in zip(_ttft(GBPS, True), _ttft(GBPS / 2, True))]
    assert rise == pytest.approx([exposed_half - exposed_full] * len(rise), abs=1e-9)
    # after prefill: the whole transfer is exposed, so TTFT rises by the whole difference
    rise_after = [b - a for a, b in zip(_ttft(GBPS, False), _ttft(GBPS / 2, False))]
    assert rise_after == pytest.approx([half - full] * len(rise_after), abs=1e-9)
    assert _ttft(GBPS / 2, False)[0] == pytest.approx(COMPUTE_S + half + SETUP_S, abs=1e-9)
    assert all(a < b for a, b in zip(_ttft(GBPS / 2, True), _ttft(GBPS / 2, False)))


def test_a_busy_link_delays_the_next_steps_kv() -> None:
    # two prompts at once, one per step: the second step's KV waits for the first to land
    t = _transfer_s(GBPS / 4)  # 320 ms, over three steps' compute
    first, second = _ttft(GBPS / 4, True, [RequestSpec(0.0, PROMPT, 4), RequestSpec(0.0, PROMPT, 4)])
    assert first == pytest.approx(COMPUTE_S / LAYERS + t + SETUP_S, abs=1e-9)
    assert second == pytest.approx(first + t + SETUP_S, abs=1e-9)


def test_link_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="link_gbps"):
        KVLink(0.0)
    with pytest.raises(ValueError, match="setup"):
        KVLink(10.0, -1.0)
    assert KVLink().transfer_s(1e12) == 0.0  # unlimited
