"""Engine, Router, InProcessCluster and ClusterClient share one `submit`/`generate` shape
(engine/generator.py): the same leading parameters, one `generate` body, and the same outputs
for the same greedy request, each under the request id its caller chose."""

from __future__ import annotations

import inspect
from typing import NamedTuple

import pytest
from disagg_helpers import CONFIG

from minipd.engine.engine import Engine
from minipd.engine.generator import GeneratesFromSubmit, Generator
from minipd.engine.request import RequestOutput
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.cluster_client import ClusterClient
from minipd.router.control_port import RouterControlPort
from minipd.router.router import Router
from minipd.router.router_config import RouterConfig

RUNNERS = (Engine, Router, InProcessCluster, ClusterClient)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPT = list(range(3, 63))  # long enough to be prefilled on the prefill instance


class Served(NamedTuple):
    cluster: InProcessCluster
    client: ClusterClient


@pytest.fixture(scope="module")
def served(loop_thread):
    async def start() -> tuple[Served, RouterControlPort]:
        cluster = await InProcessCluster.start(CONFIG, 1, 1, RouterConfig(local_prefill_max_tokens=0))
        control = RouterControlPort(cluster.router)
        client = await ClusterClient.connect("127.0.0.1", await control.serve("127.0.0.1", 0))
        return Served(cluster, client), control

    served, control = loop_thread.run(start())
    yield served
    loop_thread.run(served.client.close())
    loop_thread.run(control.close())
    loop_thread.run(served.cluster.close())


@pytest.mark.parametrize("runner", RUNNERS, ids=lambda c: c.__name__)
def test_every_runner_has_the_shared_shape(runner):
    assert runner.generate is GeneratesFromSubmit.generate  # one body, not a copy each
    params = list(inspect.signature(runner.submit).parameters.values())[1:]
    assert [p.name for p in params[:3]] == ["prompt", "params", "request_id"]
    assert params[1].default is None and params[2].default is None
    assert all(p.kind is p.KEYWORD_ONLY or p.default is not p.empty for p in params[3:])


def test_the_four_runners_answer_one_request_alike(served, make_engine, loop_thread):
    engine = make_engine(**{f: getattr(CONFIG, f) for f in CONFIG.__struct_fields__})
    runners = {"engine": engine, "router": served.cluster.router, "cluster": served.cluster, "client": served.client}

    async def run(name: str, runner: Generator) -> list[RequestOutput]:
        assert isinstance(runner, Generator)
        return [o async for o in runner.generate(PROMPT, GREEDY, f"same-{name}")]

    answers = {name: loop_thread.run(run(name, runner)) for name, runner in runners.items()}
    tokens = {name: [t for o in outputs for t in o.token_ids] for name, outputs in answers.items()}
    assert len(tokens["engine"]) == GREEDY.max_tokens
    assert all(t == tokens["engine"] for t in tokens.values()), tokens
    for name, outputs in answers.items():
        assert outputs[-1].finished and outputs[-1].error is None, (name, outputs[-1])
        assert {o.request_id for o in outputs} == {f"same-{name}"}


def test_a_client_refuses_a_request_id_it_runs_already(served, loop_thread):
    async def scenario() -> list[RequestOutput]:
        async with served.client.submit(PROMPT, GREEDY, "twice") as stream:
            with pytest.raises(InvalidRequestError, match="request_id"):
                served.client.submit(PROMPT, GREEDY, "twice")
            return [o async for o in stream]

    outputs = loop_thread.run(scenario())
    assert outputs[-1].finished and outputs[-1].error is None
