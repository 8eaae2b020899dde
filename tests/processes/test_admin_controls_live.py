"""The router's control calls against `minipd --role cluster` as a user runs it (router, one
prefill and one decode process, TCP KV), through its API key: the cluster flipped to colocated
and back, a link cap that makes the next request's KV transfer slower on /metrics and lifting
it, the ratio controller on and off, and the built-in load run to its end."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from http_helpers import start_cluster, stop
from prometheus_client.parser import text_string_to_metric_families

KEY = "controls-live-key"
WAIT_S = 120.0
PROMPT = "The KV of this prompt crosses the link from prefill to decode. " * 8  # bytes: ~500 tokens


def call(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{base}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def transfer_totals(base: str) -> tuple[float, float]:
    """(seconds, count) of minipd_kv_transfer_seconds on /metrics."""
    request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        text = response.read().decode()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return found["minipd_kv_transfer_seconds_sum"], found["minipd_kv_transfer_seconds_count"]


def one_transfer_s(base: str, tag: str) -> float:
    """Send one completion and return its KV transfer time as /metrics saw it."""
    before_s, before_n = transfer_totals(base)
    status, body = call(
        base, "POST", "/v1/completions", {"model": "tiny", "prompt": f"{tag} {PROMPT}", "max_tokens": 2}
    )
    assert status == 200, body
    after_s, after_n = transfer_totals(base)
    assert after_n == before_n + 1
    return after_s - before_s


def roles(base: str) -> dict[str, str]:
    status, body = call(base, "GET", "/admin/instances")
    assert status == 200, body
    return {e["instance"]: e["role"] for e in body["instances"]}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    server = start_cluster(
        tmp_path_factory.mktemp("controls"), "--model", "tiny", "--dtype", "float32", "--api-key", KEY
    )
    yield server.base_url
    stop(server)


def test_the_cluster_flips_to_colocated_and_back(base):
    split = roles(base)
    assert sorted(split.values()) == ["decode", "prefill"]
    status, report = call(base, "POST", "/admin/cluster_mode", {"mode": "colocated"})
    assert status == 200 and (report["both"], len(report["switches"])) == (2, 2), report
    assert set(roles(base).values()) == {"both"}
    status, report = call(base, "POST", "/admin/cluster_mode", {"mode": "split", "prefill": 1})
    assert status == 200 and (report["prefill"], report["decode"]) == (1, 1), report
    assert roles(base) == split  # the split it left


def test_a_link_cap_slows_the_next_transfer_and_lifting_it_restores_it(base):
    [prefill] = [name for name, role in roles(base).items() if role == "prefill"]
    one_transfer_s(base, "warm")  # the first to a decode peer also connects the link
    free_s = one_transfer_s(base, "free")
    status, capped = call(base, "POST", "/admin/link_cap", {"instance": prefill, "gbps": 0.004})  # 0.5 MB/s
    assert status == 200 and capped["gbps"] == 0.004, capped
    try:
        slow_s = one_transfer_s(base, "capped")
    finally:
        status, lifted = call(base, "POST", "/admin/link_cap", {"instance": prefill, "gbps": None})
    assert status == 200 and lifted["gbps"] is None and lifted["previous_gbps"] == 0.004
    assert slow_s > 0.5 and slow_s > 5 * free_s, (free_s, slow_s)
    again_s = one_transfer_s(base, "lifted")
    assert again_s < slow_s / 3, (again_s, slow_s)


def test_the_controller_is_turned_on_and_off(base):
    status, state = call(base, "POST", "/admin/controller", {"on": True, "slo": {"ttft_ms": 2000, "itl_ms": 200}})
    assert status == 200 and state["on"] and state["slo"] == {"ttft_ms": 2000.0, "itl_ms": 200.0}, state
    status, state = call(base, "POST", "/admin/controller", {"on": False})
    assert status == 200 and not state["on"]


def test_the_built_in_load_runs_to_its_end(base):
    body = {"workload": "mixed", "rate": 20.0, "num_requests": 8, "duration_s": 100}
    status, started = call(base, "POST", "/admin/load", body)
    assert status == 200 and started["state"] == "running", started
    deadline = time.monotonic() + WAIT_S
    while (progress := call(base, "GET", "/admin/load")[1])["state"] == "running":
        assert time.monotonic() < deadline, progress
        time.sleep(0.2)  # polling the run's progress, bounded by the deadline
    assert (progress["state"], progress["completed"], progress["failed"]) == ("finished", 8, 0), progress
    assert progress["ttft_s"]["count"] == 8 and progress["itl_s"]["count"] > 0
