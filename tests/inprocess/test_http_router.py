"""The HTTP front over the router of an in-process disaggregated cluster (1 prefill, 1 decode)."""

from __future__ import annotations

import asyncio
import json

import pytest
from http_helpers import OpenStream, http_json, http_post, sample, scrape

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.engine_backend import EngineBackend
from minipd.api.router_backend import RouterBackend
from minipd.engine.engine import EngineConfig
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig

MODEL = "tiny"
CONFIG = dict(model=MODEL, dtype="float32", num_blocks=32, max_model_len=256)  # texts compared exactly
LONG_MAX_TOKENS = 200
SETTLE_TIMEOUT_S = 10.0
# a prompt longer than the router's local-prefill threshold, so it is really disaggregated
PROMPT = "Prefill is compute-bound; decode is bandwidth-bound."


@pytest.fixture(scope="module")
def cluster(loop_thread):
    cluster = loop_thread.run(
        InProcessCluster.start(
            EngineConfig.of(**CONFIG),
            num_prefill=1,
            num_decode=1,
            router_config=RouterConfig(local_prefill_max_tokens=0),
        )
    )
    yield cluster
    loop_thread.run(cluster.close())


@pytest.fixture
def router_url(cluster, loop_thread):
    runner, port = loop_thread.run(
        start_http_server(build_app(RouterBackend(cluster.router), HttpConfig()), "127.0.0.1", 0)
    )
    yield f"http://127.0.0.1:{port}"
    loop_thread.run(runner.cleanup())
    assert loop_thread.run(_all_pools_full(cluster)), "a cluster instance kept requests or blocks"


@pytest.fixture
def colocated_url(make_engine, loop_thread):
    runner, port = loop_thread.run(
        start_http_server(build_app(EngineBackend(make_engine(**CONFIG), MODEL), HttpConfig()), "127.0.0.1", 0)
    )
    yield f"http://127.0.0.1:{port}"
    loop_thread.run(runner.cleanup())


async def _all_pools_full(cluster: InProcessCluster) -> bool:
    def full(s) -> bool:
        return s.num_running == s.num_waiting == 0 and s.blocks.num_free == s.blocks.num_blocks

    waits = [instance.engine.wait_until(full, SETTLE_TIMEOUT_S) for instance in cluster.instances]
    return all(stats is not None for stats in await asyncio.gather(*waits))


def test_disaggregated_text_equals_colocated_and_transfers_are_measured(router_url, colocated_url):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0.7, "seed": 99, "ignore_eos": True}
    routed = http_json("POST", f"{router_url}/v1/completions", body)
    local = http_json("POST", f"{colocated_url}/v1/completions", body)
    assert routed.status == local.status == 200
    assert routed.body["choices"][0]["text"] == local.body["choices"][0]["text"]
    assert routed.body["usage"]["completion_tokens"] == 10
    samples = scrape(router_url)
    assert sample(samples, "minipd_kv_transfer_seconds_count") == 1
    assert sample(samples, "minipd_kv_transfer_bytes_total") > 0
    assert sample(samples, "minipd_time_to_first_token_seconds_count") == 1
    roles = {dict(labels)["role"] for name, labels in samples if name == "minipd_instance_role"}
    assert roles == {"prefill", "decode"}


def test_min_tokens_holds_back_a_stop_token_on_prefill_and_decode_alike(
    router_url, colocated_url, cluster, loop_thread
):
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)

    async def greedy_tokens() -> list[int]:
        engine = cluster.instances[0].engine
        return [t async for output in engine.generate(PROMPT, params) for t in output.token_ids]

    first = loop_thread.run(greedy_tokens())[0]  # the token the prefill instance samples
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "stop_token_ids": [first]}
    assert http_json("POST", f"{router_url}/v1/completions", body).body["usage"]["completion_tokens"] == 1
    held = {**body, "min_tokens": 10}
    routed = http_json("POST", f"{router_url}/v1/completions", held)
    local = http_json("POST", f"{colocated_url}/v1/completions", held)
    assert routed.status == local.status == 200, routed.body
    assert routed.body["usage"]["completion_tokens"] == 10
    assert routed.body["choices"][0]["text"] == local.body["choices"][0]["text"]


def test_disconnect_mid_stream_aborts_on_every_instance(router_url, cluster, loop_thread):
    stream = OpenStream(
        router_url, "/v1/completions", {"prompt": PROMPT, "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True}
    )
    assert stream.next_event()["choices"][0]["text"] is not None
    stream.close()
    assert loop_thread.run(_all_pools_full(cluster)), "blocks not freed on every instance after the disconnect"
    assert sample(scrape(router_url), "minipd_request_aborts_total", cause="client_disconnect") == 1


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 10**1000}, "max_tokens"),
        ("/v1/completions", {"prompt": PROMPT, "top_k": 2**64}, "top_k"),
        ("/v1/completions", {"prompt": [1, 2, 2**64]}, "prompt[2]"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": 2**70},
            "max_completion_tokens",
        ),
    ],
)
def test_integers_msgpack_cannot_carry_are_a_400_naming_the_field_not_a_500(router_url, path, body, param):
    result = http_json("POST", router_url + path, body)
    assert result.status == 400 and result.body["error"]["param"] == param, result.body
    assert http_json("POST", f"{router_url}/v1/completions", {"prompt": PROMPT, "max_tokens": 2}).status == 200


def test_a_body_that_is_not_gzip_is_a_400_over_the_router(router_url):
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    result = http_post(f"{router_url}/v1/completions", json.dumps({"prompt": PROMPT}).encode(), headers)
    assert result.status == 400 and result.body["error"]["message"].startswith("Content-Encoding:")


@pytest.mark.parametrize("side", ["sender", "receiver"])
def test_a_real_transfer_failure_moves_the_failure_counter_and_the_request_still_completes(
    router_url, cluster, monkeypatch, side
):
    """A KV link that breaks while the KV moves: the sender's write fails, or the receiver is
    told the sender aborted. The router counts the failure on /metrics and retries the request
    elsewhere (here: the decode instance prefills it itself)."""
    prefill = cluster.instance("prefill-0")
    transport = prefill.transport
    if side == "sender":

        async def broken_write(peer_id, request_id, layer, runs):
            raise ConnectionResetError("link down")

        monkeypatch.setattr(transport, "_write", broken_write)
    else:
        original_end = transport._send_end

        async def aborting_end(peer_id, request_id, num_bytes):
            await original_end(peer_id, request_id, None)  # the receiver hears "aborted"

        monkeypatch.setattr(transport, "_send_end", aborting_end)
    before = sample(scrape(router_url), "minipd_kv_transfer_failures_total")
    result = http_json(
        "POST",
        f"{router_url}/v1/completions",
        {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True, "temperature": 0},
    )
    assert result.status == 200 and result.body["usage"]["completion_tokens"] == 4
    assert sample(scrape(router_url), "minipd_kv_transfer_failures_total") == before + 1
