"""The disaggregated request's phases and the router's disaggregation decisions on /metrics."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from minipd.api.backend import InstanceStats
from minipd.api.metrics import PHASES, ServingMetrics
from minipd.control.messages import KVLanded
from minipd.control.role import Role
from minipd.engine.block_manager import BlockUsage
from minipd.engine.config import EngineStats
from minipd.engine.request import RequestOutput, TransferInfo
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import SamplingParams
from minipd.ops.admin.disagg_decisions import DECISIONS, DisaggDecisionCollector
from minipd.policy.local_prefill import Placement
from minipd.router.routed_request import RoutedRequest
from minipd.router.router_counters import RouterCounters

TRANSFER = TransferInfo(
    "p0", "d0", 4096, 0, 0, compute_s=0.03, transfer_s=0.004, exposed_s=0.002, reserve_s=0.001, adopt_s=0.0003
)


def samples(text: bytes) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def run_request(metrics: ServingMetrics, transfer: TransferInfo | None) -> None:
    recorder = metrics.start_request()
    recorder.on_output(RequestOutput(request_id="r", token_ids=[1], text="a", num_prompt_tokens=3))
    recorder.on_output(
        RequestOutput(
            request_id="r",
            token_ids=[2],
            text="b",
            finished=True,
            finish_reason="length",
            num_prompt_tokens=3,
            num_output_tokens=2,
            transfer=transfer,
        )
    )


def phase(values: dict, suffix: str, name: str) -> float:
    return values[(f"minipd_disagg_phase_seconds_{suffix}", frozenset({("phase", name)}))]


def test_a_disaggregated_request_observes_each_phase_from_its_transfer_record():
    metrics = ServingMetrics(lambda: [])
    run_request(metrics, TRANSFER)
    values = samples(metrics.exposition())
    expected = {
        "reserve": 0.001,
        "prefill_compute": 0.03,
        "kv_transfer": 0.004,
        "kv_transfer_exposed": 0.002,
        "adopt": 0.0003,
    }
    for name, seconds in expected.items():
        assert phase(values, "count", name) == 1
        assert abs(phase(values, "sum", name) - seconds) < 1e-12
    ttft_sum = values[("minipd_time_to_first_token_seconds_sum", frozenset())]
    assert phase(values, "count", "first_token") == 1
    assert phase(values, "sum", "first_token") == ttft_sum  # the TTFT this front measured


def test_the_adopt_the_decode_instance_reports_reaches_the_transfer_record_with_the_landing():
    routed = RoutedRequest("r", [1, 2, 3], SamplingParams(), RequestStream("r", lambda _: True), layerwise=True)
    routed.transfer = msgspec.structs.replace(TRANSFER, adopt_s=None)
    routed.timestamps = (100.0, 99.99)  # prefill's compute end, first write
    routed.record_landing(KVLanded(request_id="r", landed_at=100.002, adopt_s=0.0007))
    assert routed.transfer.adopt_s == 0.0007
    assert abs(routed.transfer.exposed_s - 0.002) < 1e-9
    metrics = ServingMetrics(lambda: [])
    run_request(metrics, routed.transfer)
    values = samples(metrics.exposition())
    assert phase(values, "count", "adopt") == 1 and abs(phase(values, "sum", "adopt") - 0.0007) < 1e-12


def test_a_landing_reported_without_an_adopt_observes_no_adopt_phase():
    metrics = ServingMetrics(lambda: [])
    run_request(metrics, msgspec.structs.replace(TRANSFER, adopt_s=None))
    values = samples(metrics.exposition())
    assert phase(values, "count", "adopt") == 0 and phase(values, "count", "reserve") == 1


def test_a_colocated_request_observes_no_phase_but_every_phase_is_exported():
    metrics = ServingMetrics(lambda: [])
    run_request(metrics, None)
    values = samples(metrics.exposition())
    assert values[("minipd_requests_total", frozenset({("finish_reason", "length")}))] == 1
    for name in PHASES:
        assert phase(values, "count", name) == 0


def test_disagg_decisions_count_each_placement_under_its_decision_name():
    counters = RouterCounters()
    counters.placements[Placement.REMOTE] += 3
    counters.placements[Placement.LOCAL_SHORT] += 2
    counters.placements[Placement.LOCAL_PREFILL_BUSY] += 1
    registry = CollectorRegistry()
    registry.register(DisaggDecisionCollector(counters))
    values = samples(generate_latest(registry))

    def decision(name: str) -> float:
        return values[("minipd_disagg_decisions_total", frozenset({("decision", name)}))]

    assert decision("remote_prefill") == 3
    assert decision("local_prefill_size") == 2
    assert decision("local_prefill_load") == 1
    assert decision("local_prefill_no_prefill_instance") == 0
    assert set(DECISIONS) == set(Placement)  # a new placement must get a decision name


def test_each_instance_exports_its_running_requests_split_into_prefilling_and_decoding():
    stats = EngineStats(5, 1, 0, BlockUsage(64, 40, 24, 0), num_prefilling=2)
    metrics = ServingMetrics(lambda: [InstanceStats("d0", Role.DECODE, stats)])
    values = samples(metrics.exposition())
    assert values[("minipd_requests_prefilling", frozenset({("instance", "d0")}))] == 2
    assert values[("minipd_requests_decoding", frozenset({("instance", "d0")}))] == 3
