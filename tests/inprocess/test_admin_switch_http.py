"""The router's admin HTTP call for role switches: bad input refused with a 4xx naming it (and
the cluster keeps serving), a switch answered with its report and shown on /metrics and
/admin/instances."""

from __future__ import annotations

import socket
from unittest.mock import ANY

import pytest
from disagg_helpers import CONFIG
from http_helpers import http_json, http_post, sample, scrape, wait_until_pools_full

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.router_backend import RouterBackend
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.ops.admin.admin import router_admin

SWITCH = "/admin/switch_role"


@pytest.fixture(scope="module")
def cluster(loop_thread):
    cluster = loop_thread.run(InProcessCluster.start(CONFIG, num_prefill=1, num_decode=1))
    yield cluster
    loop_thread.run(cluster.close())


@pytest.fixture(scope="module")
def url(cluster, loop_thread):
    app = build_app(RouterBackend(cluster.router, "tiny"), HttpConfig(), extensions=[router_admin(cluster.router)])
    runner, port = loop_thread.run(start_http_server(app, "127.0.0.1", 0))
    yield f"http://127.0.0.1:{port}"
    loop_thread.run(runner.cleanup())


def completion_works(url: str) -> bool:
    body = {"model": "tiny", "prompt": "x" * 60, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    result = http_json("POST", f"{url}/v1/completions", body)
    return result.status == 200 and result.body["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize(
    "body, status, param, words",
    [
        ({"instance": "nobody", "role": "decode"}, 404, "instance", ["'nobody'", "prefill-0"]),
        ({"instance": "prefill-0", "role": "decoder"}, 400, "role", ["'decoder'", "prefill, decode, both"]),
        ({"instance": "prefill-0", "role": "router"}, 400, "role", ["not an instance role"]),
        ({"role": "decode"}, 400, "instance", ["required"]),
        ({"instance": "prefill-0", "role": "decode", "urgent": True}, 400, "urgent", ["unknown field"]),
        ({"instance": "prefill-0", "role": 7}, 400, "role", ["str"]),
        ({"instance": "prefill-0", "role": "decode", "drain_timeout_s": -1}, 400, "drain_timeout_s", ["positive"]),
        ({"instance": "prefill-0", "role": "decode", "drain_timeout_s": 1e308}, 400, "drain_timeout_s", ["3600"]),
        ({"instance": "prefill-0", "role": "prefill"}, 409, "role", ["already a prefill instance"]),
        ({"instance": "decode-0", "role": "prefill"}, 409, "role", ["last instance that can decode"]),
        (b"{not json", 400, None, ["not valid JSON"]),
    ],
)
def test_bad_input_is_refused_naming_it_and_the_cluster_serves_on(url, cluster, body, status, param, words):
    result = http_json("POST", f"{url}{SWITCH}", body)
    error = result.body["error"]
    assert result.status == status, result.body
    assert error["param"] == param
    assert all(word in error["message"] for word in words), error["message"]
    assert {h.role.value for h in cluster.router.registry.instances.values()} == {"prefill", "decode"}
    assert all(h.epoch == 0 and not h.draining for h in cluster.router.registry.instances.values())
    assert completion_works(url)


def test_a_switch_is_reported_and_shown_on_metrics_and_the_instance_list(url, cluster):
    result = http_json("POST", f"{url}{SWITCH}", {"instance": "prefill-0", "role": "decode"})
    assert result.status == 200, result.body
    report = result.body
    assert (report["instance_id"], report["from_role"], report["to_role"], report["epoch"]) == (
        "prefill-0",
        "prefill",
        "decode",
        1,
    )
    assert 0 <= report["drain_s"] <= report["total_s"] and report["excluding_drain_s"] >= 0
    listed = http_json("GET", f"{url}/admin/instances").body
    [moved] = [entry for entry in listed["instances"] if entry["instance"] == "prefill-0"]
    assert moved == {"instance": "prefill-0", "role": "decode", "epoch": 1, "switching": False, "compute": ANY}
    assert moved["compute"].startswith(f"{socket.gethostname()}/cpu:")  # what the instance said it runs on
    assert [c["to_role"] for c in listed["role_changes"]] == ["decode"]
    assert completion_works(url)  # no prefill instance left: prefilled on a decode instance
    samples = wait_until_pools_full(url)
    assert (
        sample(samples, "minipd_role_switches_total", instance="prefill-0", from_role="prefill", to_role="decode") == 1
    )
    assert sample(samples, "minipd_instance_role", instance="prefill-0", role="decode") == 1
    assert sample(samples, "minipd_instance_role_epoch", instance="prefill-0") == 1
    assert sample(samples, "minipd_role_switch_seconds", drain="included") == report["total_s"]
    assert sample(samples, "minipd_local_prefill_decisions_total", placement="local-no-prefill") >= 1

    back = http_json("POST", f"{url}{SWITCH}", {"instance": "prefill-0", "role": "prefill"})
    assert back.status == 200 and back.body["epoch"] == 2
    assert completion_works(url)
    samples = scrape(url)
    assert sample(samples, "minipd_local_prefill_decisions_total", placement="remote") >= 1
    assert sample(samples, "minipd_instance_role", instance="prefill-0", role="prefill") == 1


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_switch_body_that_is_not_json_typed_gets_415_and_changes_nothing(url, cluster, content_type):
    """A web page could send this as a "simple" cross-origin request: it must not switch roles."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    result = http_post(f"{url}{SWITCH}", b'{"instance": "prefill-0", "role": "decode"}', headers)
    assert result.status == 415, result.body
    assert result.body["error"]["param"] == "Content-Type"
    assert {h.role.value for h in cluster.router.registry.instances.values()} == {"prefill", "decode"}


def test_the_admin_routes_need_the_api_key(cluster, loop_thread):
    key = "admin-test-key"
    app = build_app(
        RouterBackend(cluster.router, "tiny"), HttpConfig(api_key=key), extensions=[router_admin(cluster.router)]
    )
    runner, port = loop_thread.run(start_http_server(app, "127.0.0.1", 0))
    try:
        body = b'{"instance": "prefill-0", "role": "decode"}'
        refused = http_post(f"http://127.0.0.1:{port}{SWITCH}", body, {"Content-Type": "application/json"})
        assert refused.status == 401, refused.body
        listed = http_post(f"http://127.0.0.1:{port}/admin/instances", b"", {"Authorization": f"Bearer {key}"})
        assert listed.status == 405  # authenticated, then the route's method is checked: GET only
    finally:
        loop_thread.run(runner.cleanup())
    assert {h.role.value for h in cluster.router.registry.instances.values()} == {"prefill", "decode"}
