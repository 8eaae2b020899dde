"""Traces of real requests, received by a real OTLP/HTTP endpoint (otlp_receiver.py decodes the
protobuf with `opentelemetry-proto`): a disaggregated process cluster on `tiny` exports one
trace per request, continuing the client's traceparent, with the router's, the decode
instance's and the prefill instance's spans in their places and order; a request whose
prefill instance is killed mid-prefill shows both its tries; a colocated server traces its
requests and flushes them at exit; a server without the flag exports nothing and never
imports the SDK.

With MINIPD_TRACE_JSON=PATH, the spans of the first disaggregated request are written there
as JSON (what `benchmarks/trace_waterfall.py` draws).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading

import pytest
from disagg_helpers import ENGINE_ARGV, ROUTER_ARGV
from http_helpers import http_post, start_colocated, stop
from otlp_receiver import OtlpReceiver, spans_summary

from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.models.arch.model_config import PRESETS

NUM_LAYERS = PRESETS["tiny"].num_layers
PROMPT_TOKENS = 100  # past --local-prefill-max-tokens: prefilled remotely, in 2 chunks of at most 64 tokens
MAX_TOKENS = 6
WAIT_S = 60.0
SERVER_KIND, ERROR = 2, 2  # the protobuf's SpanKind.SERVER and StatusCode.ERROR
TRACE_JSON_ENV = "MINIPD_TRACE_JSON"
DISAGGREGATED = ("minipd.reserve", "minipd.prefill", "minipd.decode")  # the instances' spans of a remote prefill


@pytest.fixture(scope="module")
def receiver():
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def cluster(loop_thread, receiver, tmp_path_factory):
    argv = ["--num-prefill", "2", "--num-decode", "1", "--http-port", "0", "--liveness-timeout-s", "3"]
    argv += ["--shutdown-timeout-s", "2", "--otlp-traces-endpoint", receiver.endpoint, *ENGINE_ARGV, *ROUTER_ARGV]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the children export every 200 ms
        processes = ProcessCluster.from_argv(argv, fault_dir=str(tmp_path_factory.mktemp("trace-faults")))
        loop_thread.run(processes.start(), timeout=180)
    try:
        yield processes
    finally:
        loop_thread.run(processes.stop(), timeout=120)


def _url(cluster) -> str:
    return cluster.http_url() + "/v1/completions"


def _traceparent(seed: int) -> tuple[str, str, str]:
    rng = random.Random(seed)
    trace_id, span_id = f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}"
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _complete(url: str, seed: int, traceparent: str):
    prompt = [random.Random(seed).randrange(256) for _ in range(PROMPT_TOKENS)]  # fresh: no prefix-cache hit
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
    return http_post(url, body, {"Content-Type": "application/json", "traceparent": traceparent})


def _one(spans: list[dict], name: str, **where) -> dict:
    found = [s for s in spans if s["name"] == name and all(s.get(k) == v for k, v in where.items())]
    assert len(found) == 1, f"{len(found)} {name} spans {where}: {spans_summary(spans)}"
    return found[0]


def _named(spans: list[dict], name: str) -> list[dict]:
    return sorted((s for s in spans if s["name"] == name), key=lambda s: s["start_ns"])


def _complete_trace(trace_id: str, num_tries: int, *instance_spans: str):
    """The trace is whole once the request span, every try's and the `instance_spans` came
    (each process exports its spans in the order they end, so a parent implies its children)."""

    def whole(spans: list[dict]) -> bool:
        names = [s["name"] for s in spans if s["trace_id"] == trace_id]
        return (
            "minipd.request" in names and names.count("minipd.try") == num_tries and set(instance_spans) <= set(names)
        )

    return whole


def test_one_trace_per_disaggregated_request(cluster, receiver):
    traces = [_traceparent(seed) for seed in (1, 2)]
    results: dict[int, object] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, _complete(_url(cluster), 100 + i, traces[i][2])))
        for i in range(len(traces))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert [results[i].status for i in range(len(traces))] == [200, 200], results
    for trace_id, client_span, _ in traces:
        receiver.wait_for(_complete_trace(trace_id, 1, *DISAGGREGATED), WAIT_S, f"trace {trace_id}")
        spans = receiver.spans(trace_id)
        by_id = {s["span_id"]: s for s in spans}
        assert len(by_id) == len(spans), "a span was exported twice"

        request = _one(spans, "minipd.request")
        assert request["parent_span_id"] == client_span and request["kind"] == SERVER_KIND
        assert request["service"] == "minipd-router" and request["instance"] == "router"
        assert request["attributes"]["minipd.finish_reason"] == "length"
        assert request["attributes"]["minipd.output_tokens"] == MAX_TOKENS
        assert request["attributes"]["minipd.kv.exposed_s"] >= 0
        attempt = _one(spans, "minipd.try", parent_span_id=request["span_id"])
        assert attempt["attributes"]["minipd.disagg.decision"] == "remote_prefill"
        assert attempt["attributes"]["minipd.decode_instance"] == "decode-0"
        prefill_instance = attempt["attributes"]["minipd.prefill_instance"]

        reserve = _one(spans, "minipd.reserve", parent_span_id=attempt["span_id"])
        prefill = _one(spans, "minipd.prefill", parent_span_id=attempt["span_id"])
        decode = _one(spans, "minipd.decode", parent_span_id=attempt["span_id"])
        for span, instance in ((reserve, "decode-0"), (prefill, prefill_instance), (decode, "decode-0")):
            assert span["service"] == "minipd-instance" and span["instance"] == instance, span
            assert span["attributes"]["minipd.try_id"] == attempt["attributes"]["minipd.try_id"]
            assert span["status_code"] != ERROR, span
        assert reserve["attributes"]["minipd.reserved"] is True
        # reserve, then prefill, then decode, all within the router's try and request
        assert request["start_ns"] <= attempt["start_ns"] <= reserve["start_ns"]
        assert reserve["end_ns"] <= prefill["start_ns"] and prefill["end_ns"] <= decode["start_ns"]
        assert decode["end_ns"] <= attempt["end_ns"] <= request["end_ns"]
        assert decode["attributes"]["minipd.finish_reason"] == "length"
        assert [e["name"] for e in decode["events"]][:2] == ["kv_landed", "first_token"]

        chunks = _named(spans, "minipd.prefill.chunk")
        assert len(chunks) == prefill["attributes"]["minipd.chunks"] == 2
        assert [c["attributes"]["minipd.chunk.final_tokens"] for c in chunks] == [64, PROMPT_TOKENS]
        assert all(c["parent_span_id"] == prefill["span_id"] for c in chunks)
        transfer = _one(spans, "minipd.kv_transfer", parent_span_id=prefill["span_id"])
        assert transfer["attributes"]["minipd.kv.bytes"] > 0 and transfer["attributes"]["minipd.kv.exposed_s"] >= 0
        sent = [e["attributes"]["minipd.layer"] for e in transfer["events"] if e["name"] == "layer_sent"]
        landed = [e["attributes"]["minipd.layer"] for e in transfer["events"] if e["name"] == "layer_landed"]
        # layer by layer: each layer goes out once per chunk that completed blocks of it
        assert sorted(set(sent)) == sorted(set(landed)) == list(range(NUM_LAYERS))
        assert sorted(sent) == sorted(landed) and len(sent) >= NUM_LAYERS
        times = [e["time_ns"] for e in transfer["events"]]
        assert times == sorted(times) and transfer["start_ns"] <= times[0] and times[-1] <= transfer["end_ns"]
        assert prefill["start_ns"] <= chunks[0]["start_ns"] and transfer["end_ns"] <= prefill["end_ns"]
    if os.environ.get(TRACE_JSON_ENV):
        receiver.dump(os.environ[TRACE_JSON_ENV], traces[0][0])


def test_a_request_without_a_valid_traceparent_gets_a_trace_of_its_own(cluster, receiver):
    bad = "00-not-a-trace-parent-01"
    assert _complete(_url(cluster), 300, bad).status == 200

    def new_trace(spans):
        return any(s["name"] == "minipd.request" and s["parent_span_id"] == "" and s["trace_id"] for s in spans)

    spans = receiver.wait_for(new_trace, WAIT_S, "a root request span")
    root = next(s for s in spans if s["name"] == "minipd.request" and s["parent_span_id"] == "")
    receiver.wait_for(_complete_trace(root["trace_id"], 1, *DISAGGREGATED), WAIT_S, "its instances' spans")


def test_a_retried_request_shows_both_tries(cluster, receiver, loop_thread):
    """The prefill instance of the first try is killed mid-prefill (the fault matrix's
    prefill_killed_mid_prefill): the request completes by a second try in the same trace. The
    router remembers the prompt's blocks as sent to the decode instance at the first pick, so
    the second try prefills it there (`local_prefill_size`), as one `minipd.generate`."""
    trace_id, client_span, traceparent = _traceparent(3)
    cluster.arm("prefill.computing", "stop")
    result: list = []
    client = threading.Thread(target=lambda: result.append(_complete(_url(cluster), 400, traceparent)))
    client.start()
    try:
        killed = loop_thread.run(_first_fault(cluster), timeout=WAIT_S)
        os.kill(cluster.child(killed).process.pid, signal.SIGKILL)
        client.join(WAIT_S)
    finally:
        leftover = cluster.disarm()
    assert not leftover and result and result[0].status == 200, (leftover, result)

    receiver.wait_for(_complete_trace(trace_id, 2, "minipd.generate"), WAIT_S, f"trace {trace_id} with two tries")
    spans = receiver.spans(trace_id)
    request = _one(spans, "minipd.request", parent_span_id=client_span)
    assert request["attributes"]["minipd.output_tokens"] == MAX_TOKENS and request["status_code"] != ERROR
    first, second = _named(spans, "minipd.try")
    assert first["parent_span_id"] == second["parent_span_id"] == request["span_id"]
    assert [first["attributes"]["minipd.try"], second["attributes"]["minipd.try"]] == [1, 2]
    assert first["status_code"] == ERROR and first["attributes"]["minipd.try.retried"] is True
    assert first["attributes"]["minipd.try.blamed"] == killed == first["attributes"]["minipd.prefill_instance"]
    assert second["status_code"] != ERROR and second["attributes"]["minipd.disagg.decision"] == "local_prefill_size"
    assert first["end_ns"] <= second["start_ns"]
    assert first["attributes"]["minipd.try_id"] != second["attributes"]["minipd.try_id"]
    # try 1 reserved on the decode instance; its prefill instance died before exporting anything
    reserve = _one(spans, "minipd.reserve")
    assert reserve["parent_span_id"] == first["span_id"] and reserve["instance"] == "decode-0"
    assert [s for s in spans if s["instance"] == killed] == []
    generate = _one(spans, "minipd.generate", parent_span_id=second["span_id"])
    assert generate["instance"] == "decode-0" and generate["attributes"]["minipd.output_tokens"] == MAX_TOKENS


async def _first_fault(cluster) -> str:
    import asyncio

    waits = {asyncio.ensure_future(child.faults.get()): child.name for child in cluster.children}
    try:
        done, _ = await asyncio.wait(waits, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    assert done, "no instance reached the armed fault point"
    return waits[done.pop()]


def _colocated_completion(server, traceparent: str):
    body = json.dumps({"model": "tiny", "prompt": "hello traces", "max_tokens": MAX_TOKENS}).encode()
    return http_post(server.base_url + "/v1/completions", body, {"Content-Type": "application/json", **traceparent})


def test_a_colocated_request_is_traced_and_flushed_at_exit(receiver, tmp_path, monkeypatch):
    trace_id, client_span, traceparent = _traceparent(5)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing goes out before the exit's flush
    server = start_colocated(tmp_path, "--model", "tiny", "--otlp-traces-endpoint", receiver.endpoint)
    try:
        assert _colocated_completion(server, {"traceparent": traceparent}).status == 200
    finally:
        stop(server)  # SIGTERM: the process flushes its spans before it exits
    request = _one(receiver.spans(trace_id), "minipd.request")
    assert request["parent_span_id"] == client_span and request["service"] == "minipd-instance"
    assert request["attributes"]["minipd.role"] == "both" and request["attributes"]["minipd.output_tokens"] > 0
    assert [e["name"] for e in request["events"]] == ["first_token"]


def test_nothing_is_exported_and_no_sdk_imported_when_tracing_is_off(receiver, tmp_path, monkeypatch):
    trace_id, _, traceparent = _traceparent(6)
    # an SDK set up from the environment would export there; and the process logs its imports
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint + "/v1/traces")
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    posts = receiver.num_posts
    server = start_colocated(tmp_path, "--model", "tiny")
    try:
        assert _colocated_completion(server, {"traceparent": traceparent}).status == 200
    finally:
        stop(server)
    assert receiver.spans(trace_id) == [] and receiver.num_posts == posts
    log = server.log_path.read_text()
    assert "import time:" in log and "minipd.api.serving" in log  # the import log is there ...
    assert "opentelemetry" not in log  # ... and names no module of the SDK or the API


def test_a_missing_sdk_is_a_clear_start_up_error(tmp_path):
    import subprocess
    import sys

    # the packages made unimportable for this one process
    code = (
        "import sys; sys.modules['opentelemetry.sdk.trace'] = None; from minipd.entrypoints.cli import main; "
        "sys.exit(main(['--role', 'both', '--model', 'tiny', '--port', '0', '--otlp-traces-endpoint', "
        "'http://127.0.0.1:9']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "--otlp-traces-endpoint" in done.stderr and "pip install 'minipd[otel]'" in done.stderr
