"""Request timelines from a live process cluster on `tiny` (router, one prefill and one decode
process, TCP KV transport, chunked prefill), without tracing: GET /dashboard/requests after known
requests.

- a disaggregated request shows every phase, in order, consistent within the clock alignment's
  stated error: queued, reserve, the prefill's queue and compute, one chunk per step (as many as
  it reports), the KV transfer with one interval per model layer, its exposed part (agreeing
  with the router's own figure of the request), the KV landed before the first token, adopt,
  decode, finish; its KV bytes and TTFT agree with the dashboard's request record;
- a short prompt prefilled on its decode instance is one `generate` phase up to its first token;
- a request whose client goes away after its first token ends with an `abort` event;
- a colocated instance's front (`--role both --port`) keeps its own: the engine's queue, to the
  first token, decode.
"""

from __future__ import annotations

import time

import pytest
from http_helpers import OpenStream, http_json, start_cluster, start_colocated, stop

from minipd.models.arch.model_config import preset_config

NUM_LAYERS = preset_config("tiny").num_layers
LONG_PROMPT = "hello " * 100  # ~600 tokens: ten 64-token chunks, prefilled on the prefill instance
OTHER_LONG_PROMPT = "world " * 100  # as long, sharing no cached prefix with LONG_PROMPT
SHORT_PROMPT = "hi"
WAIT_S = 60.0  # bounds the wait for a timeline to appear, on a busy machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = start_cluster(
        tmp_path_factory.mktemp("timelines"),
        *("--model", "tiny", "--dtype", "float32", "--max-num-batched-tokens", "64"),
        *("--local-prefill-max-tokens", "16"),
    )
    try:
        yield server
    finally:
        stop(server)


def timelines(base_url: str) -> dict[str, dict]:
    result = http_json("GET", f"{base_url}/dashboard/requests")
    assert result.status == 200
    return {t["request_id"]: t for t in result.body["timelines"]}


def wait_for_timeline(base_url: str, request_id: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = timelines(base_url).get(request_id)
        if found is not None:
            return found
        time.sleep(0.1)  # polling an HTTP route, bounded by the deadline
    raise AssertionError(f"no timeline of {request_id} within {WAIT_S} s")


def wait_for_record(base_url: str, request_id: str) -> dict:
    """The request's row in the dashboard's snapshot (built once a second)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        snapshot = http_json("GET", f"{base_url}/dashboard/snapshot").body
        found = [r for r in snapshot["requests"] if r["request_id"] == request_id]
        if found:
            return found[0]
        time.sleep(0.2)  # polling an HTTP route, bounded by the deadline
    raise AssertionError(f"no snapshot row of {request_id} within {WAIT_S} s")


def complete(base_url: str, prompt: str, max_tokens: int) -> dict:
    result = http_json(
        "POST",
        f"{base_url}/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True},
    )
    assert result.status == 200, result.body
    return result.body


def by_name(timeline: dict) -> dict[str, list[dict]]:
    phases: dict[str, list[dict]] = {}
    for phase in timeline["phases"]:
        phases.setdefault(phase["name"], []).append(phase)
    return phases


def event(timeline: dict, name: str) -> float:
    (found,) = [e["at_ms"] for e in timeline["events"] if e["name"] == name]
    return found


def test_a_disaggregated_request_shows_every_phase_in_order(cluster):
    body = complete(cluster.base_url, LONG_PROMPT, 6)
    t = wait_for_timeline(cluster.base_url, body["id"])
    assert (t["outcome"], t["finish_reason"], t["output_tokens"]) == ("finish", "length", 6)
    assert t["prefill_instance"] and t["decode_instance"] and t["tries"] == 1
    phases = by_name(t)
    assert {
        "queued",
        "reserve",
        "prefill_queue",
        "prefill",
        "chunk",
        "kv_transfer",
        "kv_exposed",
        "adopt",
        "decode",
    } <= set(phases)
    prefill_error = t["clock_error_ms"][t["prefill_instance"]]
    decode_error = t["clock_error_ms"][t["decode_instance"]]
    tolerance = prefill_error + decode_error + 1.0  # ms: what the alignment may be off by, and rounding

    (queued,), (reserve,), (queue,), (prefill,) = (phases[n] for n in ("queued", "reserve", "prefill_queue", "prefill"))
    assert queued["start_ms"] == 0.0 and queued["end_ms"] <= reserve["start_ms"] <= reserve["end_ms"]
    assert reserve["end_ms"] <= queue["start_ms"] + prefill_error  # the Prefill follows the Reserve's answer
    assert queue["end_ms"] == prefill["start_ms"] < prefill["end_ms"]
    # one chunk per step, in order, each within the prefill's compute
    chunks = phases["chunk"]
    assert len(chunks) == t["num_chunks"] >= 5
    for earlier, later in zip(chunks, chunks[1:]):
        assert earlier["end_ms"] <= later["start_ms"]
    assert prefill["start_ms"] <= chunks[0]["start_ms"] and chunks[-1]["end_ms"] <= prefill["end_ms"]
    # the KV: one interval per layer of the model, each sent during the prefill
    assert [layer["layer"] for layer in t["layers"]] == list(range(NUM_LAYERS))
    for layer in t["layers"]:
        assert prefill["start_ms"] <= layer["sent_ms"] <= layer["landed_ms"]
    (transfer,), (exposed,) = phases["kv_transfer"], phases["kv_exposed"]
    landed = event(t, "kv_landed")
    assert transfer["start_ms"] == min(layer["sent_ms"] for layer in t["layers"])
    # the landing is on the decode instance's clock: on a loaded machine the two alignments can
    # put it before the first write (within their errors), and a phase never ends before it starts
    assert transfer["end_ms"] == max(landed, transfer["start_ms"]) and landed >= transfer["start_ms"] - tolerance
    assert max(layer["landed_ms"] for layer in t["layers"]) <= landed + tolerance  # the receiver saw the last byte
    assert exposed["start_ms"] == prefill["end_ms"] and exposed["end_ms"] >= exposed["start_ms"]
    # first token after the KV landed (and after the adopt), then decode to the end
    first = event(t, "first_token")
    assert landed <= first + decode_error
    (adopt,) = phases["adopt"]
    assert landed <= adopt["start_ms"] + decode_error and adopt["end_ms"] <= first + decode_error
    (decode,) = phases["decode"]
    assert decode["start_ms"] == first == t["ttft_ms"] < decode["end_ms"] == t["duration_ms"] == event(t, "finish")

    # the dashboard's record of the same request (the router's figures, from wall clocks on one host)
    record = wait_for_record(cluster.base_url, body["id"])
    assert t["kv_bytes"] == record["kv_bytes"] > 0
    assert abs((exposed["end_ms"] - exposed["start_ms"]) - record["exposed_s"] * 1000) <= tolerance + 1.0
    assert abs(t["ttft_ms"] - record["ttft_s"] * 1000) <= 20.0 + 0.25 * t["ttft_ms"]  # the front's view, a hop away


def test_a_short_prompt_prefilled_on_its_decode_instance_is_one_generate_phase(cluster):
    body = complete(cluster.base_url, SHORT_PROMPT, 4)
    t = wait_for_timeline(cluster.base_url, body["id"])
    assert t["outcome"] == "finish" and t["prefill_instance"] is None and t["layers"] == []
    assert [p["name"] for p in t["phases"]] == ["queued", "generate", "decode"]
    queued, generate, decode = t["phases"]
    assert (
        queued["end_ms"] <= generate["start_ms"] < generate["end_ms"] == event(t, "first_token") == decode["start_ms"]
    )
    assert generate["where"] == decode["where"] == t["decode_instance"]


def test_a_request_whose_client_leaves_ends_with_an_abort(cluster):
    stream = OpenStream(
        cluster.base_url, "/v1/completions", {"model": "tiny", "prompt": OTHER_LONG_PROMPT, "max_tokens": 400}
    )
    try:
        first = stream.next_event()
    finally:
        stream.close()  # the client goes away after its first token
    t = wait_for_timeline(cluster.base_url, first["id"])
    assert t["prefill_instance"] is not None  # disaggregated
    assert t["outcome"] == "abort" and t["error"] is None
    assert t["events"][-1]["name"] == "abort" and t["events"][-1]["at_ms"] == t["duration_ms"]
    assert event(t, "kv_landed") <= event(t, "first_token") + t["clock_error_ms"][t["decode_instance"]]
    assert t["output_tokens"] < 400
    (decode,) = by_name(t)["decode"]
    assert decode["end_ms"] == t["duration_ms"]  # decoding until the abort


def test_a_colocated_front_keeps_its_own_timelines(tmp_path):
    server = start_colocated(tmp_path, "--model", "tiny", "--dtype", "float32")
    try:
        body = complete(server.base_url, LONG_PROMPT, 5)
        t = wait_for_timeline(server.base_url, body["id"])
    finally:
        stop(server)
    assert (t["outcome"], t["output_tokens"], t["prefill_instance"]) == ("finish", 5, None)
    assert [p["name"] for p in t["phases"]] == ["queued", "generate", "decode"]
    queued, generate, decode = t["phases"]
    assert queued["end_ms"] == generate["start_ms"] < generate["end_ms"] == t["ttft_ms"] == decode["start_ms"]
    assert decode["end_ms"] == t["duration_ms"] == event(t, "finish")
