"""HTTP corners, each as it was found, over raw sockets against the front serving an engine.

As found: a streamed answer to an HTTP/1.0 keep-alive request carried neither a length nor a
`Connection` header and stayed open 10 s after `data: [DONE]`, so an HTTP/1.0 client could not
tell where it ended; errors raised by aiohttp's own request parser (a bad Content-Length, both
Content-Length and Transfer-Encoding, a header over 8 KiB) came back as `text/plain` echoing
request bytes instead of OpenAI's error format; and every client that hung up mid-body logged
an ERROR with two tracebacks (~2.4 KB), so anyone who could reach the port could fill the log.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import NamedTuple

import msgspec
import pytest
from aiohttp import web
from http_helpers import http_json

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.engine_backend import EngineBackend
from minipd.engine.engine import EngineConfig

CONFIG = EngineConfig.of(model="tiny", num_blocks=64, max_model_len=512)
BOUND_S = 10.0  # the socket timeout: what "never answered" means here
CLOSE_AFTER_DONE_S = 2.0  # the stream's end is known this soon after [DONE] (it took 10 s)
MARKER = "zq7MARKERzq7"  # request bytes that must never come back
MAX_LOG_LINE_CHARS = 200
GOOD = {"prompt": "ok", "max_tokens": 2}


class Served(NamedTuple):
    port: int
    runner: web.AppRunner


@pytest.fixture(scope="module")
def server(loop_thread, make_engine):
    """The front with its defaults (its header timeout is the 10 s the stream stayed open)."""
    backend = EngineBackend(make_engine(**msgspec.structs.asdict(CONFIG)), "tiny")
    runner, port = loop_thread.run(start_http_server(build_app(backend, HttpConfig()), "127.0.0.1", 0))
    yield Served(port, runner)
    loop_thread.run(runner.cleanup())


def exchange(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Send `head` (then `body`) and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as sock:
        sock.sendall(head + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def split_answer(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def test_an_http10_keep_alive_stream_ends_right_after_done(server):
    body = json.dumps({**GOOD, "stream": True}).encode()
    head = (
        b"POST /v1/completions HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S) as sock:
        sock.sendall(head + body)
        received = b""
        while b"data: [DONE]\n\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, f"closed before [DONE]: {received!r}"
            received += chunk
        done_at = time.monotonic()
        while chunk := sock.recv(65536):  # the end of the answer: the server closes
            received += chunk
        closed_after = time.monotonic() - done_at
    status, headers, events = split_answer(received)
    assert status == 200 and received.startswith(b"HTTP/1.0 200")
    assert closed_after < CLOSE_AFTER_DONE_S, f"held open {closed_after:.1f} s after [DONE]"
    assert headers.get("connection", "").lower() == "close"  # said, not left to the client to guess
    assert events.endswith(b"data: [DONE]\n\n")


def test_an_http10_request_answered_whole_still_carries_its_length(server):
    body = json.dumps(GOOD).encode()
    head = b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    status, headers, answer = split_answer(exchange(server.port, head, body))
    assert status == 200 and int(headers["content-length"]) == len(answer)
    assert json.loads(answer)["choices"][0]["finish_reason"] == "length"


PARSER_ERRORS = {
    "bad Content-Length": b"Content-Length: 12" + MARKER.encode() + b"\r\n\r\n{}",
    "Content-Length and Transfer-Encoding": (
        b"X-Note: " + MARKER.encode() + b"\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}"
    ),
    "a 9 KiB header": b"X-Big: " + (MARKER * 800).encode()[: 9 * 1024] + b"\r\n\r\n",
    "a 9 KiB request line": b"\r\n\r\n",  # the line itself: see `head` below
}


@pytest.mark.parametrize("case", PARSER_ERRORS)
def test_a_request_the_parser_refuses_is_answered_in_the_openai_error_format(server, case, caplog):
    path = "/v1/completions" if case != "a 9 KiB request line" else "/v1/completions?" + MARKER * 800
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n".encode()
    caplog.set_level(logging.INFO)
    answer = exchange(server.port, head + PARSER_ERRORS[case])
    status, headers, body = split_answer(answer)
    assert 400 <= status < 500, answer[:200]
    assert headers["content-type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"] and MARKER.lower() not in answer.decode("latin-1").lower()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert http_json("POST", f"http://127.0.0.1:{server.port}/v1/completions", GOOD).status == 200


def test_a_client_that_hangs_up_mid_body_costs_one_short_info_line(server, loop_thread, caplog):
    async def handled() -> tuple[int, int]:  # on the server's loop: (requests begun, connections open)
        return server.runner.server.requests_count, len(server.runner.server.connections)

    begun_before, _ = loop_thread.run(handled())
    caplog.set_level(logging.DEBUG)
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"prompt": '
        )
    deadline = time.monotonic() + BOUND_S
    while loop_thread.run(handled()) != (begun_before + 1, 0) and time.monotonic() < deadline:
        time.sleep(0.01)  # a bounded poll until the server has done with the hung-up request
    assert loop_thread.run(handled()) == (begun_before + 1, 0), "the hung-up request was not handled"
    assert http_json("POST", f"http://127.0.0.1:{server.port}/v1/completions", GOOD).status == 200
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) <= 1, [r.getMessage() for r in lines]
    for line in lines:
        assert line.levelno == logging.INFO and not line.exc_info and len(line.getMessage()) < MAX_LOG_LINE_CHARS
