"""Helpers for the HTTP tests: a live `minipd` server process, raw HTTP calls, /metrics samples.

Every 200 answer of a generation endpoint, whole or streamed event by event, is checked
against the `openai` package's models (`openai_contract.check_body`) before a test sees it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, NamedTuple
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from contracts.openai_contract import check_body, is_generation

STARTUP_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
SETTLE_TIMEOUT_S = 10.0
ANNOUNCE_PREFIX = "minipd: serving"
READ_CHUNK_BYTES = 4096


class HttpResult(NamedTuple):
    status: int
    headers: dict[str, str]
    body: dict


class LiveServer(NamedTuple):
    base_url: str
    process: subprocess.Popen
    log_path: Path


def http_json(method: str, url: str, body: dict | bytes | None = None) -> HttpResult:
    """One HTTP call; a JSON body is decoded whatever the status."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            result = HttpResult(response.status, dict(response.headers), json.loads(response.read()))
    except urllib.error.HTTPError as error:
        return HttpResult(error.code, dict(error.headers), json.loads(error.read()))
    if method == "POST" and is_generation(urlsplit(url).path):
        check_body(urlsplit(url).path, result.body, stream=False)
    return result


def http_post(url: str, body: bytes, headers: dict[str, str]) -> HttpResult:
    """A POST with exactly these headers (plus Host and Content-Length); the body is decoded
    as JSON when it is JSON."""
    return http_request("POST", url, headers, body)


def http_request(method: str, url: str, headers: dict[str, str], body: bytes | None = None) -> HttpResult:
    """One call with exactly these headers (a `Host` among them replaces the one http.client
    writes, as `curl -H 'Host: ...'` does); the body is decoded as JSON when it is JSON."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=REQUEST_TIMEOUT_S)
    try:
        connection.request(method, parts.path, body, headers)
        response = connection.getresponse()
        raw = response.read()
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = {"raw": raw.decode(errors="replace")}
        return HttpResult(response.status, dict(response.headers), decoded)
    finally:
        connection.close()


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
        return response.read().decode()


class OpenStream:
    """A streaming POST whose connection the test closes by hand (a client that goes away)."""

    def __init__(self, base_url: str, path: str, body: dict):
        parts = urlsplit(base_url)
        self.path = path
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=REQUEST_TIMEOUT_S)
        self.connection.request(
            "POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"}
        )
        self.response = self.connection.getresponse()  # returns once the request is submitted

    def next_event(self) -> dict:
        """The next `data:` event, decoded (blocks until it arrives, bounded by the socket timeout)."""
        while True:
            line = self.response.readline()
            assert line, "stream ended early"
            if line.startswith(b"data: "):
                event = json.loads(line[len(b"data: ") :])
                if self.response.status == 200:
                    check_body(self.path, event, stream=True)
                return event

    def close(self) -> None:
        self.response.close()
        self.connection.close()


def scrape(base_url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample on /metrics, keyed by (sample name, labels)."""
    text = http_text(f"{base_url}/metrics")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def pools_full(samples: dict) -> bool:
    """No request anywhere and every instance's pool completely free."""
    totals = {dict(k[1])["instance"]: v for k, v in samples.items() if k[0] == "minipd_kv_blocks_total"}
    assert totals, "no instance reported on /metrics"
    return all(
        sample(samples, "minipd_kv_blocks_free", instance=i) == total
        and sample(samples, "minipd_requests_running", instance=i) == 0
        and sample(samples, "minipd_requests_waiting", instance=i) == 0
        for i, total in totals.items()
    )


def wait_until_pools_full(base_url: str, timeout: float = SETTLE_TIMEOUT_S) -> dict:
    """Poll /metrics until `pools_full`, failing after `timeout`; returns the last samples."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(base_url)
        if pools_full(samples):
            return samples
        assert time.monotonic() < deadline, f"pools not back to full within {timeout}s"


def start_colocated(log_dir: Path, *flags: str) -> LiveServer:
    """`minipd --role both --port 0 FLAGS`, once it announced its port and /health answers 200."""
    return _start(log_dir, "--role", "both", "--port", "0", *flags)


def start_cluster(log_dir: Path, *flags: str) -> LiveServer:
    """`minipd --role cluster --http-port 0 FLAGS` (router, one prefill and one decode process)."""
    return _start(log_dir, "--role", "cluster", "--http-port", "0", *flags)


def _start(log_dir: Path, *argv: str) -> LiveServer:
    log_path = log_dir / "server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "minipd", *argv], stdout=subprocess.PIPE, stderr=log, bufsize=0
        )
    try:
        base_url = _read_announced_url(process, log_path)
        _wait_healthy(base_url, process, log_path)
    except BaseException:
        stop(LiveServer("", process, log_path))
        raise
    return LiveServer(base_url, process, log_path)


@contextlib.contextmanager
def serving(server: LiveServer) -> Iterator[str]:
    """`server`'s base URL for the body (a fixture's `yield`); stopped after it, however it ended."""
    try:
        yield server.base_url
    finally:
        stop(server)


def stop(server: LiveServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(STOP_TIMEOUT_S)
    if server.process.stdout is not None:
        server.process.stdout.close()


def _read_announced_url(process: subprocess.Popen, log_path: Path) -> str:
    """Read stdout unbuffered (a buffered reader would hide lines from `select`) until the
    announcement line."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    pending = b""
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"server did not announce its port in {STARTUP_TIMEOUT_S}s: {log_path.read_text()}"
        readable, _, _ = select.select([process.stdout], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(process.stdout.fileno(), READ_CHUNK_BYTES)
        assert chunk, f"server exited with {process.wait(STOP_TIMEOUT_S)}: {log_path.read_text()}"
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            if text.startswith(ANNOUNCE_PREFIX):
                return text.rsplit(" on ", 1)[1].strip()


def _wait_healthy(base_url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        assert process.poll() is None, f"server exited: {log_path.read_text()}"
        try:
            if http_json("GET", f"{base_url}/health").status == 200:
                return
        except OSError:
            pass  # not accepting connections yet
        assert time.monotonic() < deadline, f"/health not ready within {STARTUP_TIMEOUT_S}s"
