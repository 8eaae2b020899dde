"""A prompt is validated in full once, at the edge that received it (engine/checked_prompt.py):
the HTTP front, the router's control port, `Router.submit`, `Engine.submit`. Whatever takes a
checked prompt on (the router, the engines of its instances) checks cheap invariants only,
and still refuses what a model could not run. A router that shuts down refuses new requests
in one place, which the HTTP front answers with 503 and Retry-After as ever."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from disagg_helpers import CONFIG
from http_helpers import http_json

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.router_backend import RouterBackend
from minipd.engine import checked_prompt
from minipd.engine.checked_prompt import CheckedPrompt, check_invariants, check_prompt
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams
from minipd.engine.unavailable import BackendUnavailableError
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.models.tokenizers.tokenizer import ByteTokenizer
from minipd.router.cluster_client import ClusterClient
from minipd.router.control_port import RouterControlPort
from minipd.router.router import SHUTDOWN_RETRY_AFTER_S, Router
from minipd.router.router_config import RouterConfig

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = list(range(3, 63))  # long enough to be prefilled on the prefill instance
VOCAB, MAX_LEN = 100, 50


class Served(NamedTuple):
    cluster: InProcessCluster
    client: ClusterClient
    url: str  # the HTTP front over the router


@pytest.fixture(scope="module")
def served(loop_thread):
    async def start():
        cluster = await InProcessCluster.start(CONFIG, 1, 1, RouterConfig(local_prefill_max_tokens=0))
        control = RouterControlPort(cluster.router)
        client = await ClusterClient.connect("127.0.0.1", await control.serve("127.0.0.1", 0))
        runner, port = await start_http_server(build_app(RouterBackend(cluster.router), HttpConfig()), "127.0.0.1", 0)
        return Served(cluster, client, f"http://127.0.0.1:{port}"), control, runner

    served, control, runner = loop_thread.run(start())
    yield served
    loop_thread.run(runner.cleanup())
    loop_thread.run(served.client.close())
    loop_thread.run(control.close())
    loop_thread.run(served.cluster.close())


@pytest.fixture
def full_checks(monkeypatch) -> list[str]:
    """The prompts validated in full (tokenized or scanned id by id), in order."""
    seen: list[str] = []
    original = checked_prompt.prompt_token_ids

    def counted(tokenizer, prompt, vocab_size, max_model_len):
        seen.append(prompt if isinstance(prompt, str) else f"{len(prompt)} ids")
        return original(tokenizer, prompt, vocab_size, max_model_len)

    monkeypatch.setattr(checked_prompt, "prompt_token_ids", counted)
    return seen


def test_a_disaggregated_request_from_python_is_checked_once(served, loop_thread, full_checks):
    outputs = loop_thread.run(_collect(served.cluster.router.generate(PROMPT, GREEDY)))
    assert outputs[-1].finished and outputs[-1].error is None and outputs[-1].transfer is not None
    assert full_checks == ["60 ids"]  # by the router; neither instance checks it again


def test_a_request_through_the_control_port_is_checked_once(served, loop_thread, full_checks):
    outputs = loop_thread.run(_collect(served.client.generate("hello there, checked once", GREEDY)))
    assert outputs[-1].finished and outputs[-1].error is None
    assert full_checks == ["hello there, checked once"]


def test_a_request_over_http_is_checked_once(served, full_checks):
    body = {"model": CONFIG.model, "prompt": "hello over http", "max_tokens": 3, "temperature": 0}
    result = http_json("POST", served.url + "/v1/completions", body)
    assert result.status == 200, result.body
    assert full_checks == ["hello over http"]


def test_the_edge_still_refuses_a_bad_prompt_naming_it(served):
    outside = served.cluster.router.vocab_size
    with pytest.raises(InvalidRequestError, match=rf"prompt_token_ids: ids \[{outside}\]"):
        served.cluster.router.submit([1, outside], GREEDY)


@pytest.mark.parametrize(
    "token_ids, params, field",
    [
        ([], GREEDY, "prompt"),
        (list(range(MAX_LEN)), GREEDY, "prompt"),
        ([1, VOCAB], GREEDY, "prompt_token_ids"),
        ([-1, 2], GREEDY, "prompt_token_ids"),
        ([1, 2], SamplingParams(stop_token_ids=(VOCAB + 5,)), "stop_token_ids"),
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
    ],
)
def test_the_invariants_refuse_what_a_model_cannot_run(token_ids, params, field):
    with pytest.raises(InvalidRequestError) as refused:
        check_invariants(CheckedPrompt(token_ids, params), VOCAB, MAX_LEN)
    assert refused.value.field == field


def test_a_checked_prompt_passes_the_invariants_and_keeps_its_seed():
    tokenizer = ByteTokenizer()
    checked = check_prompt(tokenizer, "abc", SamplingParams(max_tokens=2), tokenizer.vocab_size, MAX_LEN)
    check_invariants(checked, tokenizer.vocab_size, MAX_LEN)
    assert checked.params.seed is not None and checked.token_ids == tokenizer.encode("abc")


def test_a_checked_prompt_carries_its_own_parameters(served):
    checked = check_prompt(ByteTokenizer(), "abc", GREEDY, 256, MAX_LEN)
    with pytest.raises(TypeError, match="carries its sampling parameters"):
        served.cluster.router.submit(checked, GREEDY)


def test_a_router_shutting_down_refuses_with_one_error_that_http_answers_with_503(loop_thread):
    async def scenario():
        router = Router(ByteTokenizer())
        router.accepting = False
        with pytest.raises(BackendUnavailableError) as refused:
            router.submit("hello")
        runner, port = await start_http_server(build_app(RouterBackend(router), HttpConfig()), "127.0.0.1", 0)
        return router, runner, port, refused.value

    router, runner, port, refused = loop_thread.run(scenario())
    try:
        assert refused.retry_after_s == SHUTDOWN_RETRY_AFTER_S
        result = http_json("POST", f"http://127.0.0.1:{port}/v1/completions", {"model": "minipd", "prompt": "hi"})
        assert result.status == 503 and "shutting down" in result.body["error"]["message"]
        assert result.headers.get("Retry-After") == str(SHUTDOWN_RETRY_AFTER_S)
    finally:
        loop_thread.run(runner.cleanup())
        loop_thread.run(router.close())


async def _collect(outputs):
    return [o async for o in outputs]
