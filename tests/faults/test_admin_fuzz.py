"""Fuzzing every admin and control route of a live `minipd --role cluster` (a router, one
prefill and one decode process) with hypothesis: bodies of random shapes, bodies of the
routes' own fields with extreme numbers (inf, nan, 1e308, 1e400, -0, huge integers), wrong
types, long strings, bytes that are no JSON, other content types and methods, and GETs with
random query strings (admin_fuzz_bodies.py).

Invariants: every call is answered within REQUEST_TIMEOUT_S, never with a 5xx, an error
always as OpenAI's JSON error object; and afterwards the cluster serves a completion and
every KV pool is full again. A call that was served and changed the cluster is undone at
once (a load started is stopped and its requests end, a link cap lifted, the controller
turned off), and the roles are set back at the end, so each call meets a cluster that serves.
"""

from __future__ import annotations

import http.client
import json

import pytest
from admin_fuzz_bodies import INSTANCES, calls
from http_helpers import http_json, start_cluster, stop, wait_until_pools_full
from hypothesis import HealthCheck, given, settings

NUM_CALLS = 2500
REQUEST_TIMEOUT_S = 30.0
SERVED = 200
CLIENT_ERRORS = {400, 404, 405, 409, 413, 415}
ROLES = {"prefill-0": "prefill", "decode-0": "decode"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = start_cluster(tmp_path_factory.mktemp("admin-fuzz"), "--model", "tiny", "--dtype", "float32")
    yield server
    stop(server)


def send(base_url: str, method: str, path: str, headers: dict, body: bytes) -> tuple[int, bytes]:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT_S)
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def check_answer(status: int, raw: bytes) -> dict:
    assert status == SERVED or status in CLIENT_ERRORS, (status, raw[:500])
    answer = json.loads(raw)
    if status != SERVED:
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], answer
    return answer


def undo(base_url: str, path: str, body: bytes, answer: dict) -> None:
    """Undo a served call that changed the cluster (role changes wait for the end)."""
    if path == "/admin/load":
        stopped = http_json("POST", f"{base_url}/admin/load/stop", {})
        assert stopped.status in (200, 409), stopped.body  # 409: it ended by itself already
        wait_until_pools_full(base_url)  # its requests, aborted, are gone
    elif path == "/admin/link_cap" and answer["gbps"] is not None:
        lifted = http_json("POST", f"{base_url}/admin/link_cap", {"instance": answer["instance"], "gbps": None})
        assert lifted.status == 200 and lifted.body["gbps"] is None, lifted.body
    elif path == "/admin/controller" and answer["on"]:
        off = http_json("POST", f"{base_url}/admin/controller", {"on": False})
        assert off.status == 200 and not off.body["on"], off.body


def roles(base_url: str) -> dict[str, str]:
    return {e["instance"]: e["role"] for e in http_json("GET", f"{base_url}/admin/instances").body["instances"]}


def restore_roles(base_url: str) -> None:
    """The split the cluster started with: the instance due to decode first, so that one
    always can."""
    for name in ("decode-0", "prefill-0"):
        if roles(base_url)[name] != ROLES[name]:
            switched = http_json("POST", f"{base_url}/admin/switch_role", {"instance": name, "role": ROLES[name]})
            assert switched.status == 200, switched.body


def test_no_admin_call_gets_a_5xx_or_hangs_and_the_cluster_serves_after(cluster):
    base = cluster.base_url
    assert roles(base) == ROLES
    sent, served = [0], {}

    @settings(
        max_examples=NUM_CALLS,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(calls())
    def fuzz(call):
        method, path, headers, body = call
        sent[0] += 1
        status, raw = send(base, method, path, headers, body)
        answer = check_answer(status, raw)
        if status == SERVED and method == "POST":
            served[path] = served.get(path, 0) + 1
            undo(base, path, body, answer)

    fuzz()
    print(f"admin fuzz: {sent[0]} calls sent; served (and undone) by route: {served}")
    assert sent[0] >= NUM_CALLS
    restore_roles(base)
    assert roles(base) == ROLES
    assert http_json("GET", f"{base}/admin/load").body["state"] != "running"
    assert not http_json("GET", f"{base}/admin/controller").body["on"]
    assert set(http_json("GET", f"{base}/admin/link_cap").body["link_caps"].values()) <= {None}
    answer = http_json("POST", f"{base}/v1/completions", {"prompt": "still serving", "max_tokens": 4})
    assert answer.status == 200 and answer.body["usage"]["completion_tokens"] >= 1, answer.body
    assert set(INSTANCES) == set(roles(base))
    wait_until_pools_full(base)
