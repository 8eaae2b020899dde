"""Slow clients are cut off: headers that never complete, and bodies that never arrive.

As it was found: the HTTP server had no header or body timeout, so a client holding a
connection with a partial header (slowloris) kept it, and its memory, for an hour.
"""

from __future__ import annotations

import socket
import time

import msgspec
import pytest
from http_helpers import OpenStream, http_json

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.engine_backend import EngineBackend
from minipd.engine.engine import EngineConfig

CONFIG = EngineConfig.of(model="tiny", num_blocks=64, max_model_len=512)
TIMEOUT_S = 0.5
BOUND_S = 10.0  # what "cut off" must stay far below (the server used to wait 3,630 s)
TRICKLE_GAP_S = 0.1  # the slow client's pace: one byte per gap


@pytest.fixture(scope="module")
def server(loop_thread, make_engine):
    backend = EngineBackend(make_engine(**msgspec.structs.asdict(CONFIG)), "tiny")
    config = HttpConfig(header_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S)
    runner, port = loop_thread.run(start_http_server(build_app(backend, config), "127.0.0.1", 0))
    yield port
    loop_thread.run(runner.cleanup())


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket timeout: BOUND_S)."""
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received


def test_a_connection_whose_headers_never_complete_is_closed(server):
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: app")
    assert read_until_closed(sock) == b""
    assert TIMEOUT_S * 0.9 <= time.monotonic() - start < BOUND_S
    sock.close()


def test_headers_trickling_in_do_not_extend_the_deadline(server):
    sock = connect(server)
    start = time.monotonic()
    header = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200
    closed_after = None
    for byte in header:  # one byte per gap, for far longer than the header timeout
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            closed_after = time.monotonic() - start
            break
        time.sleep(TRICKLE_GAP_S)  # the slow client's pace, not a synchronisation
        if time.monotonic() - start > BOUND_S:
            break
    if closed_after is None:  # writes into a closed socket may still succeed once: ask the reader
        sock.settimeout(0.01)
        try:
            assert sock.recv(1) == b""
            closed_after = time.monotonic() - start
        except socket.timeout:
            pytest.fail(f"connection still open after {time.monotonic() - start:.1f} s of trickled headers")
    assert closed_after < TIMEOUT_S + BOUND_S / 2
    sock.close()


def test_a_body_that_never_arrives_in_full_gets_a_408(server):
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"prompt": '
    )
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within" in answer
    assert TIMEOUT_S * 0.9 <= time.monotonic() - start < BOUND_S
    sock.close()


def test_a_long_stream_outlives_the_header_timeout_and_the_server_keeps_serving(server):
    base = f"http://127.0.0.1:{server}"
    stream = OpenStream(base, "/v1/completions", {"prompt": "keep going", "max_tokens": 400, "ignore_eos": True})
    start = time.monotonic()
    events = [stream.next_event()]
    while events[-1]["choices"][0]["finish_reason"] is None:
        events.append(stream.next_event())
    stream.close()
    assert time.monotonic() - start > TIMEOUT_S, "the stream must last longer than the timeout for this test"
    assert events[-1]["choices"][0]["finish_reason"] == "length"  # all 400 tokens, not cut off
    assert http_json("POST", base + "/v1/completions", {"prompt": "ok", "max_tokens": 2}).status == 200
