"""One request can never abort other users' streams.

As it was found: one chat request with `"temperature": 1e-38` beside four live streams made
the sampler produce NaN, the engine step failed, and every request of the batch was aborted.
"""

from __future__ import annotations

import msgspec
import pytest
from engine_helpers import complete, greedy
from http_helpers import OpenStream, http_json

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.engine_backend import EngineBackend
from minipd.api.router_backend import RouterBackend
from minipd.engine.engine import EngineConfig
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig

CONFIG = EngineConfig.of(model="tiny", dtype="float32", num_blocks=128, max_model_len=256)
CHAT = "/v1/chat/completions"
STREAM_TOKENS = 40
EXTREMES = [{"temperature": 1e-38}, {"temperature": 5e-324}, {"temperature": 1.0, "top_p": 1e-46}]


@pytest.fixture(scope="module", params=["colocated", "router"])
def server(request, loop_thread, make_engine):
    cluster = None
    if request.param == "router":
        cluster = loop_thread.run(InProcessCluster.start(CONFIG, 1, 1, RouterConfig(local_prefill_max_tokens=0)))
        backend = RouterBackend(cluster.router)
    else:
        backend = EngineBackend(make_engine(**msgspec.structs.asdict(CONFIG)), "tiny")
    runner, port = loop_thread.run(start_http_server(build_app(backend, HttpConfig()), "127.0.0.1", 0))
    yield f"http://127.0.0.1:{port}"
    loop_thread.run(runner.cleanup())
    if cluster is not None:
        loop_thread.run(cluster.close())


def chat(text: str, **sampling) -> dict:
    return {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": STREAM_TOKENS,
        "ignore_eos": True,
        **sampling,
    }


def read_all(stream: OpenStream) -> tuple[str, list[dict]]:
    """The text of the rest of a stream, and any error events in it."""
    text, errors = [], []
    while True:
        line = stream.response.readline()
        assert line, "stream ended without [DONE]"
        if line == b"data: [DONE]\n":
            return "".join(text), errors
        if line.startswith(b"data: "):
            event = msgspec.json.decode(line[6:])
            if "error" in event:
                errors.append(event)
            else:
                text += [c["delta"].get("content") or "" for c in event["choices"]]


@pytest.mark.parametrize("extreme", EXTREMES, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_an_extreme_sampling_request_beside_four_live_streams_harms_none_of_them(server, extreme):
    alone = [http_json("POST", server + CHAT, chat(f"user {i}", temperature=0.8, seed=i)) for i in range(4)]
    streams = [OpenStream(server, CHAT, chat(f"user {i}", temperature=0.8, seed=i)) for i in range(4)]
    try:
        firsts = [s.next_event() for s in streams]  # all four are running
        assert all(f["choices"][0]["delta"].get("role") == "assistant" for f in firsts)
        extreme_reply = http_json("POST", server + CHAT, chat("the odd one", **extreme))
        rests = [read_all(s) for s in streams]
    finally:
        for s in streams:
            s.close()
    for (text, errors), reference in zip(rests, alone, strict=True):
        assert errors == []
        assert text == reference.body["choices"][0]["message"]["content"]
    # and the extreme request itself is served: as greedy, which is what those values mean
    greedy_reply = http_json("POST", server + CHAT, chat("the odd one", temperature=0))
    assert extreme_reply.status == 200, extreme_reply.body
    assert extreme_reply.body["choices"][0]["message"] == greedy_reply.body["choices"][0]["message"]


POISON = "\x7f"  # byte 127: in no other prompt, so the model can tell the poisoned request's tokens


class PoisonedModel:
    """The model, except that a forward pass over any POISON token fails."""

    def __init__(self, model):
        self.model, self.failed_batch_tokens = model, []
        self.config = model.config  # the runner reads the model's config (its attention window) every step

    def __call__(self, input_ids, *args):
        if bool((input_ids == ord(POISON)).any()):
            self.failed_batch_tokens.append(input_ids.numel())
            raise RuntimeError("the forward pass failed")
        return self.model(input_ids, *args)


def test_a_forward_pass_that_fails_for_one_request_fails_only_that_request(make_engine, loop_thread, monkeypatch):
    engine = make_engine(**msgspec.structs.asdict(CONFIG))
    prompts = [f"prompt number {i}" for i in range(4)]
    expected = [loop_thread.run(complete(engine, p, greedy(STREAM_TOKENS))).token_ids for p in prompts]
    poisoned = PoisonedModel(engine.runner.model)
    monkeypatch.setattr(engine.runner, "model", poisoned)
    poison_prompt = POISON * 3

    async def together():
        streams = [engine.submit(p, greedy(STREAM_TOKENS)) for p in prompts]
        first = [await s.__anext__() for s in streams]  # the four run, then the poison joins their batch
        poison = engine.submit(poison_prompt, greedy(STREAM_TOKENS))
        rests = []
        for s in streams:
            rests.append([o async for o in s])
        return first, rests, [o async for o in poison]

    first, rests, poison = loop_thread.run(together())
    assert max(poisoned.failed_batch_tokens) > len(poison_prompt) + 1, "the poison must share a step with others"
    for f, rest, want in zip(first, rests, expected, strict=True):
        assert rest[-1].error is None and f.token_ids + [t for o in rest for t in o.token_ids] == want
    assert poison[-1].finish_reason == "abort" and "the forward pass failed" in poison[-1].error


def test_the_python_api_refuses_a_non_finite_temperature_naming_it(make_engine):
    engine = make_engine(**msgspec.structs.asdict(CONFIG))
    with pytest.raises(ValueError, match="temperature"):
        engine.submit("hi", SamplingParams(temperature=float("inf")))
