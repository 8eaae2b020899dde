"""Conditional disaggregation: the pure placement policy, and its effect in the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from planner_helpers import profile

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.sim_request import Mode
from minipd.ops.planner.simulator import Simulator
from minipd.ops.workload import ArrivalProcess, make_workload
from minipd.policy.local_prefill import (
    LocalPrefillThresholds,
    Placement,
    PlacementInput,
    place_prefill,
)

CALM = PlacementInput(
    uncached_tokens=500,
    prefill_queue_tokens=0,
    prefill_queue_requests=0,
    num_prefill_instances=2,
    decode_kv_free_tokens=10_000,
    decode_kv_capacity_tokens=10_000,
    request_kv_tokens=600,
    decode_running=3,
    decode_max_num_seqs=64,
)
BUSY = CALM._replace(prefill_queue_tokens=5000, prefill_queue_requests=10)


def test_short_uncached_prompts_stay_local() -> None:
    rule = LocalPrefillThresholds(max_local_tokens=16)
    assert place_prefill(CALM._replace(uncached_tokens=16), rule) is Placement.LOCAL_SHORT
    assert place_prefill(CALM._replace(uncached_tokens=17), rule) is Placement.REMOTE
    assert (
        place_prefill(CALM._replace(uncached_tokens=1), LocalPrefillThresholds(max_local_tokens=0)) is Placement.REMOTE
    )


def test_without_prefill_instances_everything_is_local() -> None:
    assert place_prefill(CALM._replace(num_prefill_instances=0), LocalPrefillThresholds()) is Placement.LOCAL_NO_PREFILL


def test_a_busy_prefill_pool_sends_prompts_to_a_decode_instance_with_room() -> None:
    rule = LocalPrefillThresholds(max_local_tokens=0, prefill_busy_tokens=4096)
    assert place_prefill(CALM, rule) is Placement.REMOTE  # prefill is calm
    assert place_prefill(BUSY, rule) is Placement.LOCAL_PREFILL_BUSY
    assert place_prefill(BUSY, LocalPrefillThresholds(max_local_tokens=0)) is Placement.REMOTE  # rule off
    by_requests = LocalPrefillThresholds(max_local_tokens=0, prefill_busy_requests=8)
    assert place_prefill(BUSY, by_requests) is Placement.LOCAL_PREFILL_BUSY
    # decode vetoes when it would pass 90% of its KV, or runs as many sequences as it may
    assert place_prefill(BUSY._replace(decode_kv_free_tokens=1500), rule) is Placement.REMOTE
    assert place_prefill(BUSY._replace(decode_running=64), rule) is Placement.REMOTE
    capped = LocalPrefillThresholds(max_local_tokens=0, prefill_busy_tokens=4096, decode_max_running=3)
    assert place_prefill(BUSY, capped) is Placement.REMOTE


def test_bad_thresholds_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="max_local_tokens"):
        LocalPrefillThresholds(max_local_tokens=-1)
    with pytest.raises(ValueError, match="decode_max_kv_fraction"):
        LocalPrefillThresholds(decode_max_kv_fraction=1.5)


def _run(thresholds: LocalPrefillThresholds, workload="mixed", rate=30.0):
    p = profile(
        prefill=(2e-3, 2e-4, 0.0),
        decode=(8e-3, 1e-8, 1e-4),
        max_batched_tokens=2048,
        max_num_seqs=64,
        kv_capacity_tokens=200_000,
        num_layers=4,
        kv_bytes_per_token=4096,
    )
    specs = make_workload(workload, 800, ArrivalProcess.poisson(rate), seed=4)
    return Simulator(p, ClusterSpec.split(1, 2), SimOptions(link=KVLink(), local_prefill=thresholds)).run(specs)


def test_the_simulator_prefills_short_prompts_on_decode_and_long_ones_remotely() -> None:
    result = _run(LocalPrefillThresholds(max_local_tokens=64))
    short = result.prompt_len <= 64
    assert short.any() and (~short).any()
    assert np.all(result.mode[short] == Mode.LOCAL)
    assert np.all(result.mode[~short] == Mode.DISAGGREGATED)
    none_local = _run(LocalPrefillThresholds(max_local_tokens=0))
    assert np.all(none_local.mode == Mode.DISAGGREGATED)


def test_prefill_load_rule_relieves_an_overloaded_prefill_pool() -> None:
    # prefill-heavy at a rate one prefill instance cannot keep up with (800 tokens x 0.2 ms)
    remote = _run(LocalPrefillThresholds(max_local_tokens=0), "prefill-heavy", rate=8.0)
    relieved = _run(LocalPrefillThresholds(max_local_tokens=0, prefill_busy_tokens=4096), "prefill-heavy", rate=8.0)
    assert np.mean(relieved.mode == Mode.LOCAL) > 0.1
    assert np.percentile(relieved.ttft_s, 90) < 0.5 * np.percentile(remote.ttft_s, 90)
