"""The DNS rebinding guard on a real HTTP front (minipd/api/host_guard.py, wired by build_app):
a foreign `Host` gets 403 naming --allowed-hosts on every route, with or without an API key; a
POST from another origin (`Origin`, `Sec-Fetch-Site`) gets 403 while safe methods and clients
sending neither header pass; `allowed_hosts` adds names and `*` turns the checks off; a request
without `Host` (HTTP/1.0) and one whose target is an absolute URL are judged as documented.

A request the guard lets through reaches the route: a POST with an empty JSON object gets the
API's own 400 (no `prompt`), which tells it apart from the guard's 403."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import pytest
from http_helpers import http_request
from idle_backend import NoRequests

KEY = "host-guard-unit-key-0123456789"
TIMEOUT_S = 10.0


def call(url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, dict]:
    result = http_request(method, f"{url}{path}", headers, body)
    return result.status, result.body


def raw_call(url: str, request: bytes) -> bytes:
    """Bytes sent as they are (a request line http.client would not write); the answer's first line."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, f"connection closed after {answer!r}"
            answer += chunk
        return answer.split(b"\r\n", 1)[0]


def post(url: str, headers: dict[str, str]) -> tuple[int, dict]:
    return call(url, "POST", "/v1/completions", {"Content-Type": "application/json", **headers}, b"{}")


def port_of(url: str) -> int:
    return urlsplit(url).port


@pytest.fixture
def server(serve):
    return serve(NoRequests())


def assert_foreign_host(status: int, body: dict, name: str) -> None:
    assert status == 403, body
    error = body["error"]
    assert error["code"] == "host_not_allowed" and error["param"] == "Host"
    assert error["type"] == "invalid_request_error"
    assert f"--allowed-hosts {name}" in error["message"], error


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/metrics", "/no/such/route"])
def test_a_foreign_host_reads_nothing(server, path):
    status, body = call(server.url, "GET", path, {"Host": f"evil.example:{port_of(server.url)}"})
    assert_foreign_host(status, body, "evil.example")


def test_a_foreign_host_changes_nothing_even_from_its_own_origin(server):
    origin = f"evil.example:{port_of(server.url)}"
    status, body = post(server.url, {"Host": origin, "Origin": f"http://{origin}"})
    assert_foreign_host(status, body, "evil.example")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "LOCALHOST.", "dashboard.localhost"])
def test_the_servers_own_names_are_served(server, host):
    status, body = call(server.url, "GET", "/v1/models", {"Host": f"{host}:{port_of(server.url)}"})
    assert status == 200 and body["data"][0]["id"] == "m"


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example:{port}"},
        {"Origin": "http://127.0.0.1:1"},  # another port of this host: another origin
        {"Origin": "http://localhost:{port}"},  # another name of this server: another origin too
        {"Origin": "null"},  # a sandboxed frame, a file
        {"Origin": "http://127.0.0.1:{port}/x"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.1:{port}"},  # either header refuses
    ],
)
def test_a_post_from_another_origin_is_refused(server, headers):
    port = port_of(server.url)
    status, body = post(server.url, {k: v.format(port=port) for k, v in headers.items()})
    assert status == 403, body
    assert body["error"]["code"] == "cross_origin_refused" and body["error"]["param"] in headers
    assert "--allowed-hosts '*'" in body["error"]["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a client that is no browser
        {"Origin": "http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},
        {"Origin": "HTTP://127.0.0.1:{port}"},
        {"Sec-Fetch-Site": "none"},  # typed by the user
        {"Host": "localhost", "Origin": "http://localhost"},  # both at the scheme's default port
        {"Host": "localhost", "Origin": "https://localhost:443"},
        {"Host": "[::1]:{port}", "Origin": "http://[0::1]:{port}"},
    ],
)
def test_a_post_from_this_servers_own_origin_is_served(server, headers):
    port = port_of(server.url)
    status, body = post(server.url, {k: v.format(port=port) for k, v in headers.items()})
    assert status == 400 and body["error"]["param"] == "prompt", body  # the route's own answer


def test_safe_methods_are_not_judged_by_their_origin(server):
    headers = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    assert call(server.url, "GET", "/v1/models", headers)[0] == 200


def test_the_key_is_no_way_around_the_host_check(serve):
    server = serve(NoRequests(), api_key=KEY)
    keyed = {"Authorization": f"Bearer {KEY}"}
    status, body = call(server.url, "GET", "/v1/models", {**keyed, "Host": "evil.example"})
    assert_foreign_host(status, body, "evil.example")
    status, body = post(server.url, {**keyed, "Origin": "http://evil.example"})
    assert status == 403 and body["error"]["code"] == "cross_origin_refused"
    assert call(server.url, "GET", "/v1/models", {"Host": "localhost"})[0] == 401  # then the key is checked
    assert call(server.url, "GET", "/v1/models", {**keyed, "Host": "localhost"})[0] == 200


def test_allowed_hosts_adds_names(serve):
    server = serve(NoRequests(), allowed_hosts=("evil.example", ".corp.example"))
    for host in ("evil.example", "a.corp.example"):
        origin = f"{host}:{port_of(server.url)}"
        status, body = post(server.url, {"Host": origin, "Origin": f"http://{origin}"})
        assert status == 400 and body["error"]["param"] == "prompt", body
    assert_foreign_host(*call(server.url, "GET", "/v1/models", {"Host": "other.example"}), "other.example")


def test_a_star_turns_both_checks_off(serve):
    server = serve(NoRequests(), allowed_hosts=("*",))
    status, body = post(
        server.url, {"Host": "evil.example", "Origin": "http://other.example", "Sec-Fetch-Site": "cross-site"}
    )
    assert status == 400 and body["error"]["param"] == "prompt", body


def test_http_1_0_without_host_is_judged_by_the_address_it_arrived_on(server):
    assert raw_call(server.url, b"GET /v1/models HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200")


def test_a_host_no_name_can_be_is_refused_not_a_server_error(server):
    for host in ("evil.example:\u00b2".encode(), "\u00e9vil.example".encode(), b"[::1", b"a b"):
        line = raw_call(server.url, b"GET /v1/models HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
        assert line.startswith(b"HTTP/1.1 403"), (host, line)


def test_an_absolute_target_names_the_host_checked(server):
    port = port_of(server.url)
    line = raw_call(
        server.url, f"GET http://evil.example:{port}/v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
    )
    assert line.startswith(b"HTTP/1.1 403"), line
    line = raw_call(
        server.url, f"GET http://localhost:{port}/v1/models HTTP/1.1\r\nHost: evil.example\r\n\r\n".encode()
    )
    assert line.startswith(b"HTTP/1.1 403"), line  # the header is checked as well
    line = raw_call(server.url, f"GET http://localhost:{port}/v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    assert line.startswith(b"HTTP/1.1 200"), line
