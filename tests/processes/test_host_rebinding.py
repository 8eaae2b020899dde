"""DNS rebinding against live servers (issue 37): `minipd --role cluster` (router, one prefill and
one decode process) and `minipd --role both --port` refuse a request whose `Host` is another
site's name, and a state-changing request that another origin's page sent, with and without
an API key; `--allowed-hosts` allows more names (the launcher passes it to its router) and
`*` turns the checks off.

The first test is the issue's reproduction, which a server without the guard answers 200:

    curl -s localhost:8000/admin/link_cap -H 'Host: evil.example:8000' \\
        -H 'Origin: http://evil.example:8000' -H 'Content-Type: application/json' \\
        -d '{"instance":"prefill-0","gbps":0.001}'

Whether a refused call changed anything is read back from the router (`GET /admin/link_cap`:
the caps set through it)."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
from http_helpers import HttpResult, http_request, serving, start_cluster, start_colocated

TINY = ("--model", "tiny", "--dtype", "float32")
KEY = "rebinding-test-key-0123456789"
EVIL = "evil.example"
OTHER = "other.example"
CAP = {"instance": "prefill-0", "gbps": 0.001}
READ_PATHS = ["/dashboard", "/metrics", "/v1/models", "/admin/instances", "/admin/link_cap", "/health"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with serving(start_cluster(tmp_path_factory.mktemp("rebinding"), *TINY)) as base:
        yield base


@pytest.fixture(scope="module")
def keyed_cluster(tmp_path_factory):
    """With an API key, and evil.example allowed (the launcher must hand the flag to its router)."""
    flags = (*TINY, "--api-key", KEY, "--allowed-hosts", EVIL)
    with serving(start_cluster(tmp_path_factory.mktemp("rebinding-key"), *flags)) as base:
        yield base


def port(base: str) -> int:
    return urlsplit(base).port


def as_site(base: str, site: str, **headers: str) -> dict[str, str]:
    """The headers a browser sends for a page of `site` (rebound to this server) calling it."""
    authority = f"{site}:{port(base)}"
    return {"Host": authority, "Origin": f"http://{authority}", **headers}


def set_cap(base: str, headers: dict[str, str], cap: dict = CAP) -> HttpResult:
    body = json.dumps(cap).encode()
    return http_request("POST", f"{base}/admin/link_cap", {"Content-Type": "application/json", **headers}, body)


def caps(base: str, headers: dict[str, str] | None = None) -> dict:
    result = http_request("GET", f"{base}/admin/link_cap", headers or {})
    assert result.status == 200, result
    return result.body["link_caps"]


def assert_refused(result: HttpResult, code: str, words: str) -> None:
    assert result.status == 403, result
    error = result.body["error"]
    assert error["code"] == code and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_the_issues_reproduction_is_refused_and_changes_nothing(cluster):
    result = set_cap(cluster, as_site(cluster, EVIL))
    assert_refused(result, "host_not_allowed", f"--allowed-hosts {EVIL}")
    assert caps(cluster) == {}


@pytest.mark.parametrize("path", READ_PATHS)
def test_a_foreign_host_reads_nothing(cluster, path):
    result = http_request("GET", f"{cluster}{path}", {"Host": f"{EVIL}:{port(cluster)}"})
    assert_refused(result, "host_not_allowed", f"--allowed-hosts {EVIL}")
    assert http_request("GET", f"{cluster}{path}", {"Host": f"localhost:{port(cluster)}"}).status == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": f"http://{EVIL}:{{port}}"},  # an allowed Host, another origin's page
        {"Origin": "http://127.0.0.1:1"},  # another port of this host
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
def test_a_post_from_another_origin_is_refused_and_changes_nothing(cluster, headers):
    sent = {name: value.format(port=port(cluster)) for name, value in headers.items()}
    result = set_cap(cluster, sent)
    assert_refused(result, "cross_origin_refused", "another origin may not change anything")
    assert caps(cluster) == {}


def test_a_post_from_the_servers_own_origin_is_served(cluster):
    own = {"Origin": f"http://127.0.0.1:{port(cluster)}", "Sec-Fetch-Site": "same-origin"}
    try:
        result = set_cap(cluster, own, {"instance": "prefill-0", "gbps": 50.0})
        assert result.status == 200, result
        assert caps(cluster) == {"prefill-0": 50.0}
    finally:
        assert set_cap(cluster, {}, {"instance": "prefill-0", "gbps": None}).status == 200  # uncapped again
    assert caps(cluster) == {"prefill-0": None}


def test_the_key_is_no_way_around_the_host_check_and_allowed_hosts_adds_a_name(keyed_cluster):
    key = {"Authorization": f"Bearer {KEY}"}
    for path in READ_PATHS[:-1]:  # /health needs no key: the Host decides there too
        result = http_request("GET", f"{keyed_cluster}{path}", {**key, "Host": f"{OTHER}:{port(keyed_cluster)}"})
        assert_refused(result, "host_not_allowed", f"--allowed-hosts {OTHER}")
    assert_refused(set_cap(keyed_cluster, as_site(keyed_cluster, OTHER, **key)), "host_not_allowed", OTHER)
    assert caps(keyed_cluster, key) == {}
    assert set_cap(keyed_cluster, as_site(keyed_cluster, EVIL)).status == 401  # allowed; the key still counts
    try:
        result = set_cap(keyed_cluster, as_site(keyed_cluster, EVIL, **key))
        assert result.status == 200, result
        assert caps(keyed_cluster, {**key, "Host": EVIL}) == {"prefill-0": CAP["gbps"]}
    finally:
        assert set_cap(keyed_cluster, key, {"instance": "prefill-0", "gbps": None}).status == 200


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    with serving(start_colocated(tmp_path_factory.mktemp("rebinding-both"), *TINY)) as base:
        yield base


@pytest.mark.parametrize("path", ["/dashboard", "/metrics", "/v1/models", "/health"])
def test_a_colocated_instances_openai_port_refuses_a_foreign_host(colocated, path):
    result = http_request("GET", f"{colocated}{path}", {"Host": f"{EVIL}:{port(colocated)}"})
    assert_refused(result, "host_not_allowed", f"--allowed-hosts {EVIL}")


def test_a_colocated_instance_refuses_a_completion_from_another_site(colocated):
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    result = http_request("POST", f"{colocated}/v1/completions", {**headers, **as_site(colocated, EVIL)}, body)
    assert_refused(result, "host_not_allowed", EVIL)
    result = http_request("POST", f"{colocated}/v1/completions", {**headers, "Origin": f"http://{EVIL}"}, body)
    assert_refused(result, "cross_origin_refused", "another origin")
    assert http_request("POST", f"{colocated}/v1/completions", headers, body).status == 200


def test_a_star_allows_any_host_and_origin(tmp_path):
    with serving(start_colocated(tmp_path, *TINY, "--allowed-hosts", "*")) as base:
        assert http_request("GET", f"{base}/v1/models", {"Host": f"{EVIL}:{port(base)}"}).status == 200
        body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode()
        headers = {"Content-Type": "application/json", **as_site(base, EVIL, **{"Sec-Fetch-Site": "cross-site"})}
        assert http_request("POST", f"{base}/v1/completions", headers, body).status == 200
