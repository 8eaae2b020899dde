"""A stream whose decode instance is killed mid-stream ends with an error naming the instance.

As found: a streamed chat over `minipd --role cluster --http-port` whose decode process was
SIGKILLed ended with "internal error while generating request ...; see the server log",
though the docs promise an error naming the instance (docs/api.md, Errors). The HTTP API answered every backend
failure but an overload as an internal error, and the router did not mark a lost instance's
failure as such. Likewise, a request whose only decode instance died before its first token
ended as a 500 "internal error": its retry found no decode instance, and said only that.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import time
from typing import Iterator

import pytest
from disagg_helpers import ENGINE_ARGV

from contracts.openai_contract import check_body
from minipd.control.role import Role
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.transports.backends import available_transports

CHAT = "/v1/chat/completions"
BOUND_S = 30.0  # the stream ends this soon after the kill (the liveness timeout is 5 s)
ANNOUNCED = "serving the OpenAI API"


@contextlib.contextmanager
def _cluster(loop_thread) -> Iterator[tuple[ProcessCluster, str, int]]:
    """A 1 prefill + 1 decode cluster over tcp, every prompt prefilled remotely; yields it and
    the host and port of its HTTP API."""
    cluster = ProcessCluster.from_argv(
        ["--transport", "tcp", *ENGINE_ARGV, "--local-prefill-max-tokens", "-1", "--http-port", "0"]
    )
    loop_thread.run(cluster.start(), timeout=180)
    try:
        router = next(c for c in cluster.children if c.role is Role.ROUTER)
        url = next(line for line in router.announcements if ANNOUNCED in line).rsplit(" ", 1)[-1]
        host, port = url.removeprefix("http://").split(":")
        yield cluster, host, int(port)
    finally:
        loop_thread.run(cluster.stop(), timeout=60)


@pytest.mark.skipif("tcp" not in available_transports(), reason="the tcp transport is not available")
def test_a_stream_whose_decode_instance_is_killed_ends_with_an_error_naming_it(loop_thread):
    with _cluster(loop_thread) as (cluster, host, port):
        connection = http.client.HTTPConnection(host, port, timeout=BOUND_S)
        body = {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a long story, please " * 4}]}],
            "max_completion_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        }
        connection.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        events = []
        while len(events) < 2:  # the role chunk, then the first token's
            line = response.readline()
            assert line.startswith(b"data: ") or line == b"\n", line
            if line.startswith(b"data: "):
                events.append(json.loads(line.removeprefix(b"data: ")))
                check_body(CHAT, events[-1], stream=True)
        cluster.child("decode-0").process.send_signal(signal.SIGKILL)  # mid-stream: a token reached us
        killed_at = time.monotonic()
        rest = b""
        while not rest.endswith(b"data: [DONE]\n\n"):
            line = response.readline()
            assert line, f"the stream ended without [DONE]: {rest[-500:]!r}"
            rest += line
        ended_after = time.monotonic() - killed_at
        connection.close()
    *_, last = [json.loads(line.removeprefix(b"data: ")) for line in rest.split(b"\n") if line.startswith(b"data: {")]
    error = last["error"]
    assert error["code"] == "instance_lost" and error["type"] == "server_error", error
    assert "decode-0" in error["message"] and "internal error" not in error["message"], error
    assert cluster.configs.process.cluster_secret not in json.dumps(error)  # nothing secret in the words
    assert ended_after < BOUND_S


def _chat(connection: http.client.HTTPConnection, stream: bool) -> None:
    body = {
        "messages": [{"role": "user", "content": "a story, please"}],
        "max_completion_tokens": 40,
        "ignore_eos": True,
        "stream": stream,
    }
    connection.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})


@pytest.mark.skipif("tcp" not in available_transports(), reason="the tcp transport is not available")
def test_requests_whose_only_decode_instance_dies_before_a_token_end_naming_it(loop_thread):
    with _cluster(loop_thread) as (cluster, host, port):
        decode = cluster.child("decode-0").process
        decode.send_signal(signal.SIGSTOP)  # no token can come: the requests wait on it
        whole, streamed = (http.client.HTTPConnection(host, port, timeout=BOUND_S) for _ in range(2))
        # The whole one is sent first, the streamed one's headers come once the router routes it:
        # both are then waiting on the stopped decode instance when it is killed.
        _chat(whole, stream=False)
        _chat(streamed, stream=True)
        stream_response = streamed.getresponse()
        assert stream_response.status == 200
        decode.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        whole_response = whole.getresponse()
        whole_body = json.loads(whole_response.read())
        rest = stream_response.read()  # to the end of the stream
        ended_after = time.monotonic() - killed_at
        whole.close()
        streamed.close()
    secret = cluster.configs.process.cluster_secret
    assert whole_response.status == 502, whole_body
    assert whole_body["error"]["code"] == "instance_lost", whole_body
    assert "decode-0" in whole_body["error"]["message"] and "internal error" not in json.dumps(whole_body)
    assert secret not in json.dumps(whole_body)
    assert rest.endswith(b"data: [DONE]\n\n"), rest[-500:]
    *_, last = [json.loads(line.removeprefix(b"data: ")) for line in rest.split(b"\n") if line.startswith(b"data: {")]
    error = last["error"]
    assert error["code"] == "instance_lost" and "decode-0" in error["message"], error
    assert "internal error" not in error["message"] and secret not in json.dumps(error)
    assert ended_after < BOUND_S
