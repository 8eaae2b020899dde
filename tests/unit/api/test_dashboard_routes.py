"""The dashboard's routes on a real HTTP front: the page is open and says whether a key is
needed, every data route needs the key, the SLO call refuses bad input naming the field (and the
server keeps serving), and the event stream sends snapshots in the event-stream format."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from idle_backend import NoRequests

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.backend import InstanceStats
from minipd.control.role import Role
from minipd.engine.block_manager import BlockUsage
from minipd.engine.engine import EngineStats
from minipd.ops.dashboard.instances import EngineInstances
from minipd.ops.dashboard.observed_backend import ObservedBackend
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.ops.dashboard.routes import Dashboard
from minipd.ops.dashboard.snapshot import DashboardSLO, SnapshotBuilder
from minipd.ops.dashboard.sse import parse_sse

KEY = "dashboard-unit-key-0123456789"


class IdleBackend(NoRequests):
    def instance_stats(self):
        return [InstanceStats("local", Role.BOTH, EngineStats(0, 0, 0, BlockUsage(8, 8, 0, 0)))]


class FakeEngine:
    config = type("C", (), {"device": "cpu"})()
    placement = type("P", (), {"cpus": (0,)})()
    is_running = True
    num_steps = 5

    def stats(self):
        return EngineStats(1, 2, 0, BlockUsage(8, 6, 2, 1))


@pytest.fixture
def server(loop_thread):
    started = []

    def start(api_key: str | None):
        window = RequestWindow()
        builder = SnapshotBuilder(window, EngineInstances(FakeEngine()), DashboardSLO(1.0, 0.1), "colocated", {})
        dashboard = Dashboard(builder, interval_s=0.05, max_viewers=1)
        app = build_app(
            ObservedBackend(IdleBackend(), window), HttpConfig(api_key=api_key), extensions=[dashboard.install]
        )
        runner, port = loop_thread.run(start_http_server(app, "127.0.0.1", 0))
        started.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in started:
        loop_thread.run(runner.cleanup())


def call(method, url, body=None, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def test_page_is_open_and_says_a_key_is_needed_while_data_needs_the_key(server):
    url = server(KEY)
    status, headers, body = call("GET", f"{url}/dashboard")
    assert status == 200 and b'<meta name="minipd-auth" content="required">' in body
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    for path in ("/dashboard/dashboard.js", "/dashboard/kvtier.js", "/dashboard/dashboard.css"):
        assert call("GET", f"{url}{path}")[0] == 200
    for method, path in (("GET", "/dashboard/snapshot"), ("GET", "/dashboard/events"), ("POST", "/dashboard/slo")):
        assert call(method, f"{url}{path}", {"ttft_ms": 1, "itl_ms": 1})[0] == 401
    status, _, body = call("GET", f"{url}/dashboard/snapshot", key=KEY)
    snapshot = json.loads(body)
    assert status == 200 and snapshot["mode"] == "colocated" and snapshot["kv_tier"] is None
    (row,) = snapshot["pools"]["colocated"]
    assert (row["running"], row["waiting"], row["blocks"]["used"], row["compute"].split("/")[1]) == (1, 2, 2, "cpu:0")


def test_page_without_a_key_says_none_is_needed(server):
    assert b'content="none"' in call("GET", f"{server(None)}/dashboard")[2]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"ttft_ms": -1, "itl_ms": 10}, "ttft_ms"),
        ({"ttft_ms": 100, "itl_ms": 0}, "itl_ms"),
        ({"ttft_ms": 100, "itl_ms": 1e12}, "itl_ms"),
        ({"ttft_ms": "fast", "itl_ms": 10}, "ttft_ms"),
        ({"ttft_ms": 100}, "itl_ms"),
        ({"ttft_ms": 100, "itl_ms": 5e-324}, "itl_ms"),  # in seconds it would round to 0
        ({"ttft_ms": 1e-300, "itl_ms": 10}, "ttft_ms"),
    ],
)
def test_bad_slo_is_a_400_naming_the_field_and_the_server_keeps_serving(server, body, field):
    url = server(None)
    status, _, answer = call("POST", f"{url}/dashboard/slo", body)
    assert status == 400, answer
    assert field in json.loads(answer)["error"]["message"]
    status, _, answer = call("POST", f"{url}/dashboard/slo", {"ttft_ms": 250, "itl_ms": 25})
    assert status == 200 and json.loads(answer) == {"ttft_s": 0.25, "itl_s": 0.025, "source": "page"}
    assert json.loads(call("GET", f"{url}/dashboard/snapshot")[2])["slo"]["source"] == "page"


def test_events_stream_snapshots_and_cap_their_viewers(server):
    url = urlsplit(server(KEY))
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.request("GET", "/dashboard/events", headers={"Authorization": f"Bearer {KEY}"})
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    received = b""
    while len(parse_sse(received)) < 2:
        received += response.read1(65536)
    events = parse_sse(received)
    assert all(name == "snapshot" for name, _ in events)
    assert json.loads(events[1][1])["pools"]["colocated"][0]["instance"] == "local"
    status, _, answer = call("GET", f"{url.geturl()}/dashboard/events", key=KEY)  # max_viewers=1
    assert status == 503 and "viewers" in json.loads(answer)["error"]["message"]
    connection.close()
