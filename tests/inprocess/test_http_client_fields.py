"""The request fields established clients send, each accepted with its meaning or refused by name.

As found: guidellm got a 400 on every chat request. It streams with `stream_options:
{"include_usage": true, "continuous_usage_stats": true}` (vLLM's extension: the usage in
every chunk), `max_tokens` and `max_completion_tokens` both, content-part messages and
`ignore_eos`, and minipd refused the unknown `continuous_usage_stats`. Every streamed event
here is checked against the `openai` package's models (contracts/strict_openai.py).
"""

from __future__ import annotations

import http.client
import json

import msgspec
import pytest
from http_helpers import http_json

from contracts.strict_openai import ResponseKind, parse_strict
from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.engine_backend import EngineBackend
from minipd.engine.engine import EngineConfig
from minipd.engine.sampling_params import SamplingParams

CONFIG = EngineConfig.of(model="tiny", num_blocks=64, max_model_len=512)
TIMEOUT_S = 30.0
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_TOKENS = 12
GUIDELLM_CHAT = {  # as guidellm's OpenAI backend sends a chat request with a fixed output length
    "model": "tiny",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "tell me a story about a cat"}]}],
    "max_tokens": MAX_TOKENS,
    "max_completion_tokens": MAX_TOKENS,
    "stop": None,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


@pytest.fixture(scope="module")
def base(loop_thread, engine):
    backend = EngineBackend(engine, "tiny")
    runner, port = loop_thread.run(start_http_server(build_app(backend, HttpConfig()), "127.0.0.1", 0))
    yield f"http://127.0.0.1:{port}"
    loop_thread.run(runner.cleanup())


def stream_events(base: str, path: str, body: dict) -> list[dict]:
    """Every `data:` event of a streamed 200 answer up to `[DONE]`, each parsed strictly."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        events: list[dict] = []
        while (line := response.readline()) != b"data: [DONE]\n":
            assert line, "the stream ended without [DONE]"
            if line.startswith(b"data: "):
                events.append(json.loads(line.removeprefix(b"data: ")))
                parse_strict(events[-1], ResponseKind.for_endpoint(path, stream=True))
        return events
    finally:
        connection.close()


def test_guidellm_chat_request_streams_usage_in_every_chunk(base):
    events = stream_events(base, CHAT, GUIDELLM_CHAT)
    *chunks, last = events
    usages = [parse_strict(e, ResponseKind.CHAT_COMPLETION_CHUNK).usage for e in events]
    assert all(u is not None for u in usages), "a chunk without usage"
    prompt_tokens = usages[0].prompt_tokens
    assert prompt_tokens > 0 and all(u.prompt_tokens == prompt_tokens for u in usages)
    assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in usages)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and usages[0].completion_tokens == 0
    token_chunks = chunks[1:]  # one event per token, each counting the tokens so far
    assert [u.completion_tokens for u in usages[1 : len(chunks)]] == list(range(1, len(token_chunks) + 1))
    assert len(token_chunks) == MAX_TOKENS and token_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert last["choices"] == [] and usages[-1].completion_tokens == MAX_TOKENS  # include_usage's last chunk


def test_without_continuous_usage_stats_only_the_last_chunk_has_usage(base):
    body = {**GUIDELLM_CHAT, "stream_options": {"include_usage": True}}
    *chunks, last = stream_events(base, CHAT, body)
    assert all("usage" not in chunk for chunk in chunks)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == MAX_TOKENS


def test_continuous_usage_stats_without_include_usage_adds_no_usage_as_in_vllm(base):
    body = {**GUIDELLM_CHAT, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    events = stream_events(base, CHAT, body)
    assert events[-1]["choices"][0]["finish_reason"] == "length"  # no usage chunk after the last token
    assert all("usage" not in event for event in events)


@pytest.mark.parametrize(
    "path, extra, param",
    [
        (
            CHAT,
            {"stream_options": {"include_usage": True, "continuous_usage_stat": True}},
            "stream_options.continuous_usage_stat",
        ),
        (CHAT, {"best_off": 2}, "best_off"),
        (CHAT, {"repetition_penalty": 1.2}, "repetition_penalty"),
        (CHAT, {"min_p": 0.1}, "min_p"),
        (CHAT, {"skip_special_tokens": False}, "skip_special_tokens"),
        (CHAT, {"include_stop_str_in_output": True}, "include_stop_str_in_output"),
        (CHAT, {"continue_final_message": True}, "continue_final_message"),
        (CHAT, {"add_generation_prompt": False}, "add_generation_prompt"),
        (CHAT, {"min_tokens": -1, "ignore_eos": False}, "min_tokens"),
        (CHAT, {"min_tokens": MAX_TOKENS + 1}, "min_tokens"),
        (CHAT, {"top_k": -2}, "top_k"),
    ],
)
def test_a_field_minipd_cannot_honour_is_a_400_naming_it(base, path, extra, param):
    result = http_json("POST", base + path, {**GUIDELLM_CHAT, **extra})
    assert result.status == 400, result.body
    assert result.body["error"]["param"] == param and param in result.body["error"]["message"]


def test_vllm_bench_serve_completion_request_is_served(base):
    body = {  # as `vllm bench serve --backend vllm` sends it
        "model": "tiny",
        "prompt": "hello there",
        "repetition_penalty": 1.0,
        "max_tokens": MAX_TOKENS,
        "logprobs": None,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    *_, last = stream_events(base, COMPLETIONS, body)
    assert last["usage"]["completion_tokens"] == MAX_TOKENS


def test_min_tokens_top_k_minus_one_and_neutral_extensions_are_honoured(base):
    body = {
        **GUIDELLM_CHAT,
        "stream": False,
        "stream_options": None,
        "min_tokens": MAX_TOKENS,
        "top_k": -1,
        "temperature": 0,
        "seed": 7,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    result = http_json("POST", base + CHAT, body)
    assert result.status == 200, result.body
    assert result.body["usage"]["completion_tokens"] == MAX_TOKENS
    greedy = http_json("POST", base + CHAT, {**body, "top_k": 0, "seed": 8})
    assert greedy.body["choices"][0]["message"] == result.body["choices"][0]["message"]


def test_stop_token_ids_end_the_output_at_that_token(base, engine, loop_thread):
    prompt = "count with me"
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)

    async def greedy_tokens() -> list[int]:
        return [t async for output in engine.generate(prompt, params) for t in output.token_ids]

    tokens = loop_thread.run(greedy_tokens())
    stop_at = next(i for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])  # first seen there
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stop_token_ids": [tokens[stop_at]]}
    result = http_json("POST", base + COMPLETIONS, body)
    assert result.status == 200, result.body
    assert result.body["choices"][0]["finish_reason"] == "stop"
    assert result.body["usage"]["completion_tokens"] == stop_at + 1  # the stop token counts, as in vLLM


def test_min_tokens_holds_back_stop_token_ids_and_stop_strings_without_ignore_eos(base, engine, loop_thread):
    prompt = "count with me"
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)

    async def greedy_tokens() -> list[int]:
        return [t async for output in engine.generate(prompt, params) for t in output.token_ids]

    first = loop_thread.run(greedy_tokens())[0]
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stop_token_ids": [first]}
    early = http_json("POST", base + COMPLETIONS, body)
    assert early.body["usage"]["completion_tokens"] == 1, early.body  # the stop token ends it at once
    held = http_json("POST", base + COMPLETIONS, {**body, "min_tokens": MAX_TOKENS, "stop": ["e", " "]})
    assert held.status == 200, held.body
    assert held.body["usage"]["completion_tokens"] == MAX_TOKENS
    assert held.body["choices"][0]["finish_reason"] == "length"
