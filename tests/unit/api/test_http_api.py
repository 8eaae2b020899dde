"""The HTTP front in-process, on the shared loop thread, serving an engine: bad input, metrics, aborts
(a failing backend: test_http_failures.py).

Every engine here is checked by the autouse `pools_back_to_full` fixture after each test.
"""

from __future__ import annotations

import gzip
import json

import pytest
from http_helpers import OpenStream, http_json, http_post, sample, scrape

from minipd.api.app import METRICS_KEY
from minipd.api.engine_backend import EngineBackend

MODEL = "tiny"
MAX_MODEL_LEN = 512
MAX_BODY_BYTES = 16 * 1024
LONG_MAX_TOKENS = 480
SECRET = "secret internal detail"


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(model=MODEL, num_blocks=32, max_model_len=MAX_MODEL_LEN, max_num_seqs=1)


@pytest.fixture
def server(serve, engine):
    return serve(EngineBackend(engine, MODEL), max_waiting_requests=None)


GOOD = {"prompt": "ok", "max_tokens": 2}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.mark.parametrize(
    "path, body, status, param, words",
    [
        (COMPLETIONS, b"{not json", 400, None, "not valid JSON"),
        (COMPLETIONS, b"", 400, None, "not valid JSON"),
        (COMPLETIONS, {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens", "got `str`"),
        (COMPLETIONS, {"prompt": "hi", "temperature": [1]}, 400, "temperature", "expected"),
        (COMPLETIONS, {"prompt": "hi", "best_off": 2}, 400, "best_off", "unknown field"),
        (COMPLETIONS, {"max_tokens": 2}, 400, "prompt", "required"),
        (COMPLETIONS, {"prompt": "x" * MAX_MODEL_LEN}, 400, "prompt", "max_model_len"),
        (COMPLETIONS, {"prompt": ""}, 400, "prompt", "empty"),
        (COMPLETIONS, {"prompt": [1, 2, 99999]}, 400, "prompt", "vocabulary"),
        (COMPLETIONS, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "positive integer, got 0"),
        (COMPLETIONS, {"prompt": "hi", "temperature": -1}, 400, "temperature", ">= 0"),
        (COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p", "(0, 1]"),
        (COMPLETIONS, {"prompt": "hi", "top_k": -2}, 400, "top_k", "non-negative"),
        (COMPLETIONS, {"prompt": "hi", "seed": -5}, 400, "seed", "2**63"),
        (COMPLETIONS, {"prompt": "hi", "stop": [""]}, 400, "stop", "non-empty"),
        (COMPLETIONS, {"prompt": "hi", "n": 2}, 400, "n", "n=1"),
        (COMPLETIONS, {"prompt": "hi", "echo": True}, 400, "echo", "not supported"),
        (COMPLETIONS, {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options", "stream"),
        (COMPLETIONS, {"prompt": "hi", "model": "llama-9000"}, 404, "model", "llama-9000"),
        (CHAT, {"messages": []}, 400, "messages", "at least one"),
        (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role", "robot"),
        (CHAT, {"messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content", "got `int`"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages[0].content[0].type",
            "image_url",
        ),
        (CHAT, {"messages": [{"role": "user", "content": "x" * MAX_MODEL_LEN}]}, 400, "messages", "max_model_len"),
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400, "logprobs", "not supported"),
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "tools": []}, 400, "tools", "unknown field"),
        (COMPLETIONS, {"prompt": "x" * (MAX_BODY_BYTES + 1)}, 413, None, "body size"),
        # integers the control plane cannot carry (msgpack holds 64 bits): 400 naming the field, never 500
        (COMPLETIONS, {"prompt": "hi", "max_tokens": 10**1000}, 400, "max_tokens", "<= 9223372036854775807"),
        (COMPLETIONS, {"prompt": "hi", "max_tokens": -(10**1000)}, 400, "max_tokens", ">= -9223372036854775808"),
        (COMPLETIONS, {"prompt": "hi", "top_k": 2**64}, 400, "top_k", "<= 9223372036854775807"),
        (COMPLETIONS, {"prompt": "hi", "seed": 2**64}, 400, "seed", "<= 9223372036854775807"),
        (COMPLETIONS, {"prompt": "hi", "n": 2**64}, 400, "n", "<= 9223372036854775807"),
        (COMPLETIONS, {"prompt": "hi", "best_of": 2**64}, 400, "best_of", "<= 9223372036854775807"),
        (COMPLETIONS, {"prompt": "hi", "logprobs": 2**64}, 400, "logprobs", "<= 9223372036854775807"),
        (COMPLETIONS, {"prompt": [1, 2**64]}, 400, "prompt[1]", "<= 9223372036854775807"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2**64},
            400,
            "max_completion_tokens",
            "<= 9223372036854775807",
        ),
        (
            CHAT,
            {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2**64},
            400,
            "top_logprobs",
            "<= 9223372036854775807",
        ),
        # inside messages, as at the top level, what minipd cannot honour is refused, not dropped
        (
            CHAT,
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": []}]},
            400,
            "messages[0].tool_calls",
            "unknown field",
        ),
        (
            CHAT,
            {"messages": [{"role": "user", "content": "x", "tool_call_id": "t"}]},
            400,
            "messages[0].tool_call_id",
            "unknown field",
        ),
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache": 1}]}]},
            400,
            "messages[0].content[0].cache",
            "unknown field",
        ),
    ],
)
def test_bad_input_gets_its_status_and_names_the_problem(server, path, body, status, param, words):
    result = http_json("POST", server.url + path, body)
    error = result.body["error"]
    assert result.status == status, error
    assert error["param"] == param and words in error["message"]
    if param is not None:
        assert error["message"].startswith(f"{param}: ")
    assert set(error) == {"message", "type", "param", "code"}
    assert http_json("POST", server.url + COMPLETIONS, GOOD).status == 200  # still serving


@pytest.mark.parametrize(
    "encoding, body",
    [
        ("gzip", b"this is not gzip"),
        ("deflate", b"nor deflate"),
        ("gzip", gzip.compress(json.dumps(GOOD).encode(), mtime=0)[:10] + b"\xff" * 16),  # a gzip header, then garbage
    ],
)
def test_a_body_that_does_not_decode_as_its_content_encoding_says_is_a_400(server, encoding, body):
    result = http_post(
        server.url + COMPLETIONS, body, {"Content-Type": "application/json", "Content-Encoding": encoding}
    )
    assert result.status == 400, result.body
    assert result.body["error"]["message"].startswith(f"Content-Encoding: the request body is not valid {encoding}")
    assert http_json("POST", server.url + COMPLETIONS, GOOD).status == 200  # still serving


def test_a_gzip_body_is_read(server):
    body = gzip.compress(json.dumps(GOOD).encode())
    result = http_post(server.url + COMPLETIONS, body, {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert result.status == 200 and result.body["usage"]["completion_tokens"] == 2


def test_a_named_chat_message_is_accepted(server):
    body = {"messages": [{"role": "user", "content": "hi", "name": "alice"}], "max_tokens": 2}
    assert http_json("POST", server.url + CHAT, body).status == 200


@pytest.mark.parametrize("method, path, status", [("GET", "/v1/nothing", 404), ("GET", COMPLETIONS, 405)])
def test_unknown_routes_answer_in_the_openai_error_format(server, method, path, status):
    result = http_json(method, server.url + path)
    assert result.status == status and path in result.body["error"]["message"]


def test_overload_rejects_beyond_the_waiting_limit(serve, engine):
    served = serve(EngineBackend(engine, MODEL), max_waiting_requests=0, retry_after_s=7)
    result = http_json("POST", served.url + COMPLETIONS, GOOD)
    assert result.status == 503 and result.headers["Retry-After"] == "7"
    assert "limit 0" in result.body["error"]["message"]
    samples = scrape(served.url)
    assert sample(samples, "minipd_request_overloads_total", cause="waiting_limit") == 1
    assert sample(samples, "minipd_request_overloads_total", cause="kv_capacity") == 0


def test_completed_requests_are_counted_and_timed(serve, engine):
    served = serve(EngineBackend(engine, MODEL))  # a fresh app: its own registry starts at zero
    assert (
        http_json("POST", served.url + COMPLETIONS, {"prompt": "one", "max_tokens": 3, "ignore_eos": True}).status
        == 200
    )
    chat = {"messages": [{"role": "user", "content": "two"}], "max_tokens": 2, "ignore_eos": True}
    assert http_json("POST", served.url + CHAT, chat).status == 200
    stream = OpenStream(served.url, COMPLETIONS, {"prompt": "three", "max_tokens": 4, "ignore_eos": True})
    events = [stream.next_event()]
    while events[-1]["choices"][0]["finish_reason"] is None:
        events.append(stream.next_event())
    stream.close()
    assert http_json("POST", served.url + COMPLETIONS, {"prompt": ""}).status == 400  # refused: not a request
    samples = scrape(served.url)
    finished = sum(sample(samples, "minipd_requests_total", finish_reason=r) for r in ("stop", "length", "abort"))
    assert sample(samples, "minipd_time_to_first_token_seconds_count") == finished == 3
    assert sample(samples, "minipd_generation_tokens_total") == 3 + 2 + 4
    assert sample(samples, "minipd_request_queue_time_seconds_count") == 3
    assert sample(samples, "minipd_inter_token_latency_seconds_count") == 2 + 1 + 3
    assert sample(samples, "minipd_kv_transfer_seconds_count") == 0  # colocated: nothing moves
    assert sample(samples, "minipd_kv_blocks_total", instance="local") == 32


def test_every_generated_token_is_one_event(server):
    # A stop string longer than the output holds all of its text back until the end; clients
    # still see one event per token, so they can time every token.
    body = {"prompt": "tick", "max_tokens": 6, "ignore_eos": True, "temperature": 0, "stop": ["@" * 8]}
    stream = OpenStream(server.url, COMPLETIONS, body)
    events = [stream.next_event()]
    while events[-1]["choices"][0]["finish_reason"] is None:
        events.append(stream.next_event())
    stream.close()
    assert len(events) == 6 and events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(event["choices"][0]["text"] == "" for event in events[:-1])


def test_transfer_recorders_feed_the_transfer_series(serve, engine):
    served = serve(EngineBackend(engine, MODEL))
    metrics = served.app[METRICS_KEY]
    metrics.record_transfer(4096, seconds=0.01, exposed_seconds=0.002)
    metrics.record_transfer_failure()
    samples = scrape(served.url)
    assert sample(samples, "minipd_kv_transfer_bytes_total") == 4096
    assert sample(samples, "minipd_kv_transfer_exposed_seconds_sum") == pytest.approx(0.002)
    assert sample(samples, "minipd_kv_transfer_failures_total") == 1


def test_disconnect_aborts_running_and_waiting_requests(serve, engine, loop_thread):
    served = serve(EngineBackend(engine, MODEL, kv_admission_ratio=None))  # the second must wait, not be refused
    body = {"prompt": "hold on", "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True}
    running = OpenStream(served.url, COMPLETIONS, body)
    assert running.next_event()["choices"]  # it runs (max_num_seqs=1), so the next one waits
    waiting = OpenStream(served.url, COMPLETIONS, body)
    assert loop_thread.run(_stats(engine)).num_waiting == 1
    waiting.close()  # it never wrote a byte: only handler cancellation can notice
    stats = loop_thread.run(_poll_stats(engine, lambda s: s.num_waiting == 0))
    assert stats.num_running == 1, "the waiting request should leave the queue while the other still runs"
    running.close()
    assert loop_thread.run(_settled(engine)), "engine not idle after the clients left"
    samples = scrape(served.url)
    assert sample(samples, "minipd_request_aborts_total", cause="client_disconnect") == 2
    assert sample(samples, "minipd_requests_total", finish_reason="abort") == 2
    assert sample(samples, "minipd_kv_blocks_free", instance="local") == 32


async def _stats(engine):
    return engine.stats()


async def _poll_stats(engine, predicate, timeout: float = 10.0):
    """The engine's stats once `predicate(stats)` holds; fails after `timeout` seconds."""
    stats = await engine.wait_until(predicate, timeout)
    assert stats is not None, f"condition not met within {timeout}s: {engine.stats()}"
    return stats


async def _settled(engine) -> bool:
    return await engine.wait_idle(timeout=10.0)
