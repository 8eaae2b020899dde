"""A request the cluster has no KV room for (its decode pool stays full past `kv_wait_s`) fails
as an overload, and says so: 503 with `overloaded_error`, the reason and `Retry-After` when it
is not streamed, the same error in-band when it is, `error_kind` in the Python API. Never as an
internal error, which would tell the client nothing and hide a retryable condition."""

from __future__ import annotations

import json
import urllib.request

import pytest
from http_helpers import http_post
from prometheus_client.parser import text_string_to_metric_families

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.router_backend import RouterBackend
from minipd.engine.engine import EngineConfig
from minipd.engine.request import OVERLOADED
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig

CONFIG = EngineConfig.of(model="tiny", dtype="float32", num_blocks=16, max_model_len=256)
HOLD_TOKENS = 240  # 15 of the decode instance's 16 blocks
PROMPT = "a prompt of two blocks, which the one free block cannot hold"
SETTLE_S = 10.0


@pytest.fixture(scope="module")
def cluster(loop_thread):
    router_config = RouterConfig(local_prefill_max_tokens=0, kv_admission_ratio=None, kv_wait_s=0.05)
    cluster = loop_thread.run(InProcessCluster.start(CONFIG, num_prefill=1, num_decode=1, router_config=router_config))
    yield cluster
    loop_thread.run(cluster.close())


@pytest.fixture
def full_decode_pool(cluster, loop_thread):
    """The decode instance's pool held all but one block, as by requests that run long."""
    decode = cluster.instance("decode-0").engine
    blocks, _ = decode.reserve(list(range(3, 3 + HOLD_TOKENS)))
    yield
    decode.release_blocks(blocks)

    async def settled():
        def full(s):
            return s.num_running == s.num_waiting == 0 and s.blocks.num_free == s.blocks.num_blocks

        return [await i.engine.wait_until(full, SETTLE_S) for i in cluster.instances]

    assert all(loop_thread.run(settled())), "a pool did not return to full"


@pytest.fixture
def url(cluster, loop_thread):
    runner, port = loop_thread.run(
        start_http_server(build_app(RouterBackend(cluster.router), HttpConfig()), "127.0.0.1", 0)
    )
    yield f"http://127.0.0.1:{port}"
    loop_thread.run(runner.cleanup())


def _post(url: str, body: dict):
    return http_post(f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})


def kv_overloads(url: str) -> float:
    """The server's `minipd_request_overloads_total{cause="kv_capacity"}`."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return next(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "minipd_request_overloads_total" and s.labels == {"cause": "kv_capacity"}
    )


def test_a_request_with_no_decode_room_is_answered_503_overloaded_with_the_reason(full_decode_pool, url):
    before = kv_overloads(url)
    result = _post(url, {"prompt": PROMPT, "max_tokens": 4})
    assert result.status == 503, result.body
    assert kv_overloads(url) == before + 1  # counted once, under its cause
    error = result.body["error"]
    assert error["type"] == "overloaded_error"
    assert "had no room for the prompt's KV" in error["message"] and "retry later" in error["message"]
    assert int(result.headers["Retry-After"]) >= 1


def test_a_streamed_request_gets_the_overload_in_band(full_decode_pool, url):
    before = kv_overloads(url)
    result = _post(url, {"prompt": PROMPT, "max_tokens": 4, "stream": True})
    assert result.status == 200  # the status line went out before the router knew
    assert kv_overloads(url) == before + 1
    events = [json.loads(line[6:]) for line in result.body["raw"].splitlines() if line.startswith("data: {")]
    errors = [e["error"] for e in events if "error" in e]
    assert len(errors) == 1 and errors[0]["type"] == "overloaded_error"
    assert "had no room for the prompt's KV" in errors[0]["message"]
    assert result.body["raw"].rstrip().endswith("data: [DONE]")


def test_the_python_api_marks_the_failure_as_an_overload(full_decode_pool, cluster, loop_thread):
    async def last_output():
        return [out async for out in cluster.generate(PROMPT, SamplingParams(max_tokens=4))][-1]

    last = loop_thread.run(last_output())
    assert last.finished and last.error_kind == OVERLOADED and "had no room" in last.error


def test_a_request_that_fits_is_served_as_usual(cluster, url):
    before = kv_overloads(url)
    result = _post(url, {"prompt": PROMPT, "max_tokens": 4})
    assert result.status == 200 and result.body["choices"][0]["text"] is not None
    assert kv_overloads(url) == before  # no overload counted
