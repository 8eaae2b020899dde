"""The dashboard's planner routes on a real HTTP front with a real plan worker: every bad input
is a 400 naming its field (checked on the router's side, or by the worker for the profile), a
worker that gives no answer is a 503 saying so, and the front keeps serving after each; with
`--api-key` every planner route needs the key."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

import pytest
from test_dashboard_routes import KEY, FakeEngine, IdleBackend

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.ops.dashboard.instances import EngineInstances
from minipd.ops.dashboard.observed_backend import ObservedBackend
from minipd.ops.dashboard.plan_client import PlanClient
from minipd.ops.dashboard.plan_routes import PlanRoutes
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.ops.dashboard.routes import Dashboard
from minipd.ops.dashboard.snapshot import DashboardSLO, SnapshotBuilder

GOOD = {"num_instances": 3, "num_prefill": 1, "workload": "mixed", "rate_rps": 5, "num_requests": 40}


@pytest.fixture
def server(loop_thread):
    started = []

    def start(api_key: str | None = None, client: PlanClient | None = None, flag_profile: str | None = None):
        window = RequestWindow()
        builder = SnapshotBuilder(window, EngineInstances(FakeEngine()), DashboardSLO(1.0, 0.1), "colocated", {})
        dashboard = Dashboard(builder, interval_s=0.05, max_viewers=1)
        routes = PlanRoutes(client or PlanClient(), window, lambda: dashboard.hub.snapshot, "m", flag_profile)
        app = build_app(
            ObservedBackend(IdleBackend(), window),
            HttpConfig(api_key=api_key),
            extensions=[dashboard.install, routes.install],
        )
        runner, port = loop_thread.run(start_http_server(app, "127.0.0.1", 0))
        started.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in started:  # its cleanup stops the plan worker
        loop_thread.run(runner.cleanup())


def call(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    h = {"Content-Type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, data=body, method=method, headers=h | (headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def plan(base: str, **fields) -> tuple[int, dict]:
    return call("POST", f"{base}/dashboard/plan", json.dumps(GOOD | fields).encode())


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"num_instances": 0}, "num_instances"),
        ({"num_instances": 65}, "num_instances"),
        ({"mode": "sideways"}, "mode"),
        ({"num_prefill": 3}, "num_prefill"),
        ({"num_prefill": 0}, "num_prefill"),
        ({"workload": "nope"}, "workload"),
        ({"prompt_len": "bogus:12"}, "prompt_len"),
        ({"output_len": "uniform:9"}, "output_len"),
        ({"rate_rps": -1}, "rate_rps"),
        ({"rate_rps": 1e9}, "rate_rps"),
        ({"ttft_ms": 0}, "ttft_ms"),
        ({"itl_ms": -5}, "itl_ms"),
        ({"target": 1.5}, "target"),
        ({"link_gbps": -1}, "link_gbps"),
        ({"link_gbps": 0}, "link_gbps"),
        ({"num_requests": 5}, "num_requests"),
        ({"num_requests": 10**6}, "num_requests"),
        ({"rate_rps": "fast"}, "rate_rps"),
        ({"colour": "green"}, "colour"),
        ({"profile": "no-such-profile"}, "profile"),  # refused by the worker
        ({"profile": "flag"}, "profile"),  # this server has no --plan-profile
        ({"profile_json": "{]"}, "profile"),
        ({"profile_json": "x" * (1 << 20)}, "profile_json"),
    ],
)
def test_bad_plan_input_is_a_400_naming_the_field(server, fields, param):
    base = server()
    status, answer = plan(base, **fields)
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer
    assert answer["error"]["message"].startswith(param), answer
    status, answer = plan(base)  # and the server goes on planning
    assert status == 200 and answer["selected"]["label"] == "1P:2D"


def test_a_body_that_is_not_json_is_refused(server):
    base = server()
    assert call("POST", f"{base}/dashboard/plan", b"{not json")[0] == 400
    request = urllib.request.Request(f"{base}/dashboard/plan", data=b"{}", method="POST")  # no JSON content type
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 415


def test_a_plan_answers_every_split_and_the_green_zone(server):
    base = server()
    status, answer = plan(base, mode="colocated", ttft_ms=2000, itl_ms=200)
    assert status == 200
    assert [b["label"] for b in answer["bars"]] == ["colocated x3", "1P:2D", "2P:1D"]
    assert answer["selected"]["label"] == "colocated x3"
    assert answer["green_zone"] == [b["label"] for b in answer["bars"] if b["green"]]
    assert answer["link"]["split"] == "1P:2D"
    status, profiles = call("GET", f"{base}/dashboard/plan/profiles")
    assert status == 200 and "llama3-8b-h100" in profiles["builtin"] and profiles["flag"] is None


def test_a_worker_that_does_not_answer_is_a_503_and_the_front_keeps_serving(server):
    hanging = PlanClient(timeout_s=1.0, argv=[sys.executable, "-c", "import time; time.sleep(60)"])
    base = server(client=hanging)
    status, answer = plan(base)
    assert status == 503 and "did not answer within 1 s" in answer["error"]["message"], answer
    assert hanging.process is None  # stopped
    with urllib.request.urlopen(f"{base}/health", timeout=30) as response:
        assert response.status == 200
    hanging.argv = [sys.executable, "-m", "minipd.ops.planner.plan_worker"]
    hanging.timeout_s = 60.0
    assert plan(base)[0] == 200  # a new worker serves the next call


def test_the_prediction_says_when_it_has_no_profile_or_no_data(server):
    base = server()
    status, answer = call("POST", f"{base}/dashboard/prediction", b"{}")
    assert status == 200 and answer["state"] == "no profile" and "--plan-profile" in answer["reason"]
    status, answer = call("POST", f"{base}/dashboard/prediction", json.dumps({"profile": "llama3-8b-h100"}).encode())
    assert status == 200 and answer["state"] == "no data"
    status, answer = call("POST", f"{base}/dashboard/prediction", json.dumps({"profile": 3}).encode())
    assert status == 400 and answer["error"]["param"] == "profile"


def test_with_a_key_every_planner_route_needs_it(server):
    base = server(api_key=KEY)
    with urllib.request.urlopen(f"{base}/dashboard/plan.js", timeout=30) as response:  # the script is open
        assert response.status == 200 and b"/dashboard/plan" in response.read()
    for method, path, body in (
        ("GET", "/dashboard/plan/profiles", None),
        ("POST", "/dashboard/plan", json.dumps(GOOD).encode()),
        ("POST", "/dashboard/prediction", b"{}"),
    ):
        assert call(method, f"{base}{path}", body)[0] == 401, path
        assert call(method, f"{base}{path}?api_key={KEY}", body)[0] == 401, path
        assert call(method, f"{base}{path}", body, {"Authorization": f"Bearer {KEY}"})[0] == 200, path
