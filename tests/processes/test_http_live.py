"""The OpenAI API of a live server process, through the official `openai` client and raw HTTP.

`server` is parametrised over `SERVERS`: each entry starts one kind of deployment with
the same limits (one request running at a time, at most one waiting) and yields its base
URL: a colocated instance, and a local disaggregated cluster (router + one prefill + one
decode process, TCP KV transport) whose router serves the API.
"""

from __future__ import annotations

import openai
import pytest
from http_helpers import (
    OpenStream,
    http_json,
    sample,
    scrape,
    start_cluster,
    start_colocated,
    stop,
    wait_until_pools_full,
)

from contracts.openai_contract import CHECKED, strict_openai_client
from contracts.strict_openai import ResponseKind

MODEL = "tiny"
MAX_MODEL_LEN = 512
LONG_MAX_TOKENS = 480  # long enough to still be running while the test does several calls
# float32 pinned: streamed and whole texts, and stopped and full texts, are compared exactly.
COMMON_FLAGS = (
    "--model",
    MODEL,
    "--dtype",
    "float32",
    "--num-blocks",
    "64",
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--max-num-seqs",
    "1",
    "--max-waiting-requests",
    "1",
)

SERVERS = {
    "colocated": lambda log_dir: start_colocated(log_dir, *COMMON_FLAGS),
    "disaggregated": lambda log_dir: start_cluster(log_dir, *COMMON_FLAGS, "--local-prefill-max-tokens", "-1"),
}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request, tmp_path_factory):
    live = SERVERS[request.param](tmp_path_factory.mktemp(request.param))
    yield live.base_url
    try:
        wait_until_pools_full(live.base_url)  # nothing leaked across the whole module
    finally:
        stop(live)


@pytest.fixture(scope="module")
def client(server):
    return strict_openai_client(f"{server}/v1", timeout=30)


SAMPLED = dict(max_tokens=12, temperature=0.8, top_p=0.95, seed=1234, extra_body={"top_k": 50, "ignore_eos": True})


def test_streamed_completion_equals_non_streamed(client):
    before = CHECKED.copy()
    whole = client.completions.create(model=MODEL, prompt="Prefill is compute-bound;", **SAMPLED)
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens > 0
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Prefill is compute-bound;",
            stream=True,
            stream_options={"include_usage": True},
            **SAMPLED,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    # every body the client parsed was checked against the openai models first
    assert CHECKED[ResponseKind.COMPLETION] - before[ResponseKind.COMPLETION] == 1
    assert CHECKED[ResponseKind.COMPLETION_CHUNK] - before[ResponseKind.COMPLETION_CHUNK] == len(chunks)


def test_streamed_chat_equals_non_streamed(client):
    before = CHECKED.copy()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, minipd"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, **SAMPLED)
    reply = whole.choices[0]
    assert reply.message.role == "assistant" and reply.finish_reason == "length"
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True, **SAMPLED))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.message.content
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage is None
    assert CHECKED[ResponseKind.CHAT_COMPLETION] - before[ResponseKind.CHAT_COMPLETION] == 1
    assert CHECKED[ResponseKind.CHAT_COMPLETION_CHUNK] - before[ResponseKind.CHAT_COMPLETION_CHUNK] == len(chunks)


def test_stop_string_ends_the_completion(client):
    greedy = dict(max_tokens=24, temperature=0.0, extra_body={"ignore_eos": True})
    text = client.completions.create(model=MODEL, prompt="Decode is bandwidth-bound.", **greedy).choices[0].text
    stop = next(ch for ch in text[1:] if ch != "\ufffd")  # a complete character, not a partial UTF-8 one
    stopped = client.completions.create(model=MODEL, prompt="Decode is bandwidth-bound.", stop=[stop], **greedy)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-5", prompt="hi", max_tokens=2)
    assert info.value.body["param"] == "model" and "gpt-5" in info.value.body["message"]


def test_overload_answers_503_with_retry_after(server):
    body = {"model": MODEL, "prompt": "occupy", "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True}
    running = OpenStream(server, "/v1/completions", body)
    try:
        assert running.next_event()["choices"][0]["text"] is not None  # a token: it runs, nothing waits
        waiting = OpenStream(server, "/v1/completions", body)  # headers came back: it is queued
        try:
            refused = http_json("POST", f"{server}/v1/completions", body)
            assert refused.status == 503 and int(refused.headers["Retry-After"]) > 0
            assert refused.body["error"]["type"] == "overloaded_error" and "waiting" in refused.body["error"]["message"]
        finally:
            waiting.close()
    finally:
        running.close()
    wait_until_pools_full(server)
    assert http_json("POST", f"{server}/v1/completions", {"prompt": "back", "max_tokens": 2}).status == 200


def test_disconnect_mid_stream_frees_every_block(server):
    before = scrape(server)
    stream = OpenStream(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "go on"}], "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True},
    )
    assert stream.next_event()["choices"][0]["delta"]["role"] == "assistant"
    assert "content" in stream.next_event()["choices"][0]["delta"]
    stream.close()
    after = wait_until_pools_full(server)
    disconnects = "minipd_request_aborts_total"
    assert (
        sample(after, disconnects, cause="client_disconnect")
        == sample(before, disconnects, cause="client_disconnect") + 1
    )


EXPECTED_ROLES = {"colocated": {("local", "both")}, "disaggregated": {("prefill-0", "prefill"), ("decode-0", "decode")}}


def test_metrics_count_every_completed_request(server, client, request):
    before = scrape(server)
    for seed in range(3):
        client.completions.create(
            model=MODEL, prompt="count me", max_tokens=3, seed=seed, extra_body={"ignore_eos": True}
        )
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta("minipd_time_to_first_token_seconds_count") == 3
    assert delta("minipd_requests_total", finish_reason="length") == 3
    assert delta("minipd_generation_tokens_total") == 9
    assert delta("minipd_e2e_request_latency_seconds_count") == 3
    roles = {
        (dict(labels)["instance"], dict(labels)["role"])
        for (name, labels), value in after.items()
        if name == "minipd_instance_role" and value == 1
    }
    assert roles == EXPECTED_ROLES[request.node.callspec.params["server"]]
