"""GET /dashboard/requests on a real HTTP front: under the API key like the other data routes
(the page's timelines.js and timelines.css stay open), the store's timelines newest first (the
`limit` newest; a bad limit is a 400 naming it)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from idle_backend import NoRequests

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.engine.request import RequestOutput
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.ops.dashboard.routes import Dashboard
from minipd.ops.dashboard.snapshot import DashboardSLO, SnapshotBuilder
from minipd.ops.dashboard.timelines_route import timelines_extension
from minipd.router.timeline_store import TimelineStore

KEY = "timelines-unit-key-0123456789"


class NoInstances:
    def rows(self) -> list[dict]:
        return []


@pytest.fixture
def front(loop_thread):
    runners = []

    def start(store: TimelineStore, api_key: str | None = None) -> str:
        builder = SnapshotBuilder(RequestWindow(), NoInstances(), DashboardSLO(1.0, 0.1), "router", {})
        extensions = [Dashboard(builder).install, timelines_extension(store)]
        app = build_app(NoRequests(), HttpConfig(api_key=api_key), extensions=extensions)
        runner, port = loop_thread.run(start_http_server(app, "127.0.0.1", 0))
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        loop_thread.run(runner.cleanup())


def get(url: str, key: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_timelines_need_the_key_and_come_newest_first(front):
    store = TimelineStore(capacity=2)
    for request_id in ("a", "b", "c"):
        store.start(request_id, 0.0, 5).end(RequestOutput.aborted(request_id, None, 5))
    url = front(store, KEY)
    assert get(f"{url}/dashboard/requests")[0] == 401
    assert get(f"{url}/dashboard/requests", "wrong-key")[0] == 401
    for page_file in ("/dashboard/timelines.js", "/dashboard/timelines.css"):
        status, body = get(f"{url}{page_file}")
        assert status == 200 and body  # the page's files hold no data: open, like dashboard.js
    status, body = get(f"{url}/dashboard/requests", KEY)
    document = json.loads(body)
    assert status == 200 and (document["version"], document["capacity"]) == (3, 2)
    assert [t["request_id"] for t in document["timelines"]] == ["c", "b"]
    assert {t["outcome"] for t in document["timelines"]} == {"abort"}
    status, body = get(f"{url}/dashboard/requests?limit=1", KEY)
    assert status == 200 and [t["request_id"] for t in json.loads(body)["timelines"]] == ["c"]


@pytest.mark.parametrize("limit", ["0", "3", "-1", "two", "1.5", "9" * 5000])
def test_a_bad_limit_is_a_400_naming_it_and_the_front_keeps_serving(front, limit):
    store = TimelineStore(capacity=2)
    store.start("a", 0.0, 5).end(RequestOutput.aborted("a", None, 5))
    url = front(store)
    status, body = get(f"{url}/dashboard/requests?limit={limit}")
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "limit" and "limit" in error["message"]
    status, body = get(f"{url}/dashboard/requests?limit=1")
    assert status == 200 and [t["request_id"] for t in json.loads(body)["timelines"]] == ["a"]
