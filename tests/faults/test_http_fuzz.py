"""Fuzzing the HTTP API with hypothesis: bodies, headers, encodings.

Whatever arrives, the answer is never a 500 (nor a stream that fails in-band), every error
is in OpenAI's format, a stream of another user running meanwhile is unaffected (the same
text as when run alone), and every KV pool is full again at the end.
"""

from __future__ import annotations

import gzip
import http.client
import json
import threading
import zlib

import msgspec
import pytest
from http_helpers import OpenStream, http_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.engine_backend import EngineBackend
from minipd.api.router_backend import RouterBackend
from minipd.engine.engine import EngineConfig
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig

CONFIG = EngineConfig.of(model="tiny", dtype="float32", num_blocks=64, max_model_len=128)  # any request ends soon
EXAMPLES_PER_BACKEND = 100
REQUEST_TIMEOUT_S = 30.0
SENTINEL = {"prompt": "the sentinel stream", "max_tokens": 24, "temperature": 0.7, "seed": 5, "ignore_eos": True}
# statuses a well-behaved server may answer garbage with (415: should JSON bodies require a JSON type)
CLIENT_ERRORS = {400, 404, 405, 408, 413, 415}
OVERLOAD = {503}
AIOHTTP_PLAIN_400 = "Can not decode content-encoding"  # refused by aiohttp's parser before the app


class Server:
    def __init__(self, url: str, port: int, pools):
        self.url, self.port, self.pools = url, port, pools


@pytest.fixture(scope="module", params=["colocated", "router"])
def server(request, loop_thread, make_engine):
    cluster = None
    if request.param == "router":
        cluster = loop_thread.run(InProcessCluster.start(CONFIG, 1, 1, RouterConfig(local_prefill_max_tokens=8)))
        backend, pools = RouterBackend(cluster.router), [i.engine for i in cluster.instances]
    else:
        engine = make_engine(**msgspec.structs.asdict(CONFIG))
        backend, pools = EngineBackend(engine, "tiny"), [engine]
    config = HttpConfig(max_request_body_bytes=64 * 1024, header_timeout_s=5.0, body_timeout_s=5.0)
    runner, port = loop_thread.run(start_http_server(build_app(backend, config), "127.0.0.1", 0))
    yield Server(f"http://127.0.0.1:{port}", port, pools)
    loop_thread.run(runner.cleanup())
    if cluster is not None:
        loop_thread.run(cluster.close())


# ---- what is sent ---------------------------------------------------------------------------
EXTREMES = [
    0,
    1,
    -1,
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**40,
    1e-46,
    1e-38,
    5e-324,
    1e308,
    -1e308,
    0.5,
    2.0,
    "",
    "0",
    "x" * 50,
    [],
    {},
    None,
    True,
    False,
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
    | st.sampled_from(EXTREMES)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
sensible = {
    "max_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(0, 50),
    "seed": st.integers(0, 2**63 - 1),
    "stream": st.booleans(),
    "ignore_eos": st.booleans(),
    "stop": st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=2),
    "stream_options": st.fixed_dictionaries(
        {"include_usage": st.booleans()}, optional={"continuous_usage_stats": st.booleans()}
    ),
    "stop_token_ids": st.lists(st.integers(0, 300), max_size=2),
    "min_tokens": st.integers(0, 8),
}
OTHER_FIELDS = [
    "n",
    "model",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "echo",
    "best_of",
    "suffix",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "repetition_penalty",
    "min_p",
    "skip_special_tokens",
    "tools",
    "bogus",
]
optional_fields = {**{k: v | values for k, v in sensible.items()}, **{k: values for k in OTHER_FIELDS}}
prompts = st.text(max_size=40) | st.lists(st.integers(-3, 300) | st.sampled_from([2**63, 2**64, -1]), max_size=8)
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url"]) | values, "text": st.text(max_size=10)}, optional={"extra": values}
)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "robot"]) | values,
            "content": st.text(max_size=30) | st.lists(parts, max_size=2) | values,
        },
        optional={"name": st.text(max_size=5) | values, "tool_calls": values, "weird": values},
    ),
    max_size=3,
)
completion_bodies = st.fixed_dictionaries({"prompt": prompts | values}, optional=optional_fields)
chat_bodies = st.fixed_dictionaries({"messages": messages | values}, optional=optional_fields)
good_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(min_size=1, max_size=12)}
    ),
    min_size=1,
    max_size=2,
)
good_bodies = st.fixed_dictionaries(
    {"prompt": st.text(min_size=1, max_size=20)}, optional=sensible
) | st.fixed_dictionaries({"messages": good_messages}, optional=sensible)


@st.composite
def nearly_good_bodies(draw):
    """A request that is served, or one with a single field gone wrong."""
    body = draw(good_bodies)
    if "stream_options" in body:
        body["stream"] = True  # only allowed with it
    if draw(st.integers(0, 2)) == 0:
        body[draw(st.sampled_from(list(sensible) + OTHER_FIELDS + ["prompt"]))] = draw(values)
    return body


@st.composite
def requests(draw):
    """(method, path, headers, body bytes)"""
    shape = draw(st.sampled_from(["nearly good"] * 3 + ["completion", "chat", "value", "bytes"]))
    if shape == "bytes":
        body = draw(
            st.binary(max_size=64)
            | st.sampled_from([b"{", b'{"prompt": NaN}', b'{"prompt": Infinity}', b"\xff\xfe", b'{"prompt": "a"}' * 2])
        )
    else:
        value = draw(
            {
                "nearly good": nearly_good_bodies(),
                "completion": completion_bodies,
                "chat": chat_bodies,
                "value": values,
            }[shape]
        )
        body = json.dumps(value).encode()
    if shape == "nearly good" and draw(st.integers(0, 9)):  # mostly sent where it belongs
        path = "/v1/chat/completions" if "messages" in value else "/v1/completions"
    else:
        path = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/x"]))
    encoding = draw(
        st.sampled_from(
            [None] * 8 + ["gzip", "gzip", "deflate", "identity", "gzip-raw", "br", "x-unknown", "gzip, deflate"]
        )
    )
    content_type = draw(
        st.sampled_from(["application/json"] * 4 + ["application/json; charset=utf-8", "text/plain", None])
    )
    headers = {} if content_type is None else {"Content-Type": content_type}
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "deflate":
        body = zlib.compress(body)
    if encoding is not None:
        headers["Content-Encoding"] = encoding.removesuffix("-raw")
    method = draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT"]))
    return method, path, headers, body


# ---- what must come back ------------------------------------------------------------------
def send(port: int, method: str, path: str, headers: dict, body: bytes) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def check_answer(status: int, headers: dict, raw: bytes) -> None:
    assert status == 200 or status in CLIENT_ERRORS | OVERLOAD, (status, raw[:300])
    content_type = headers.get("content-type", "")
    if status != 200:
        if AIOHTTP_PLAIN_400 in raw.decode(errors="replace"):
            assert status == 400
            return
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        if status in OVERLOAD:
            assert "retry-after" in headers
        return
    if content_type.startswith("text/event-stream"):
        lines = raw.decode().split("\n\n")
        assert lines[-2] == "data: [DONE]", raw[-200:]
        events = [json.loads(line[6:]) for line in lines[:-2] if line.startswith("data: ")]
        assert all("error" not in event for event in events), raw[:500]
    else:
        json.loads(raw)  # a completion, the model list, or health


def run_sentinel(url: str, expected: str, stop: threading.Event, outcomes: list) -> None:
    """Another user's streams, one after the other, for as long as the fuzzing runs."""
    while not stop.is_set():
        stream = OpenStream(url, "/v1/completions", SENTINEL)
        try:
            text = []
            while True:
                event = stream.next_event()
                text.append(event["choices"][0]["text"] if "choices" in event else f"<{event}>")
                if "choices" not in event or event["choices"][0]["finish_reason"] is not None:
                    break
            outcomes.append("".join(text) == expected)
        except Exception as exc:  # noqa: BLE001 - recorded, and the test fails on it
            outcomes.append(repr(exc))
        finally:
            stream.close()


def test_no_input_gets_a_500_or_harms_another_users_stream(server, loop_thread):
    expected = http_json("POST", server.url + "/v1/completions", {**SENTINEL, "stream": False})
    assert expected.status == 200
    stop, outcomes = threading.Event(), []
    sentinel = threading.Thread(
        target=run_sentinel, args=(server.url, expected.body["choices"][0]["text"], stop, outcomes)
    )
    sentinel.start()

    @settings(
        max_examples=EXAMPLES_PER_BACKEND,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(requests())
    def fuzz(request):
        check_answer(*send(server.port, *request))

    try:
        fuzz()
    finally:
        stop.set()
        sentinel.join(REQUEST_TIMEOUT_S)
    assert outcomes and all(outcome is True for outcome in outcomes), outcomes
    assert http_json("POST", server.url + "/v1/completions", {"prompt": "still", "max_tokens": 2}).status == 200
    for engine in server.pools:
        assert loop_thread.run(engine.wait_idle(10.0))
        stats = engine.stats()
        assert stats.num_running == stats.num_waiting == 0 and stats.blocks.num_free == stats.blocks.num_blocks
