"""Two routers (`--role router`, both finding the instances in a real etcd) in front of one
prefill and two decode instances with small KV pools, loaded concurrently through both so
that together they ask for far more KV than the decode pools hold. Neither router owns the
pools: each decode instance refuses a reservation it cannot honour, and the router sends the
request to the other decode instance, waits for room, or answers it as overloaded. Every
request completes token for token like a colocated engine or fails as overloaded (never for
another reason), none is lost, both decode instances served, and every pool returns to full."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from disagg_helpers import CONFIG, ENGINE_ARGV
from engine_helpers import Completion
from etcd_server import etcd_fixture, needs_etcd  # noqa: F401 (the fixture `etcd`)
from minipd_process import Process
from role_switch_helpers import complete_all, greedy, load_prompts

from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.router.cluster_client import ClusterClient
from minipd.transports.backends import available_transports

pytestmark = [needs_etcd, pytest.mark.skipif("tcp" not in available_transports(), reason="no tcp transport")]

PREFIX = "/routers"
NUM_BLOCKS = 16  # per instance: a handful of requests' KV (256 tokens, the model length below)
OUTPUT = 8
PER_ROUTER = 12  # prompts of 40..120 tokens: 3..8 blocks each, ~130 blocks asked of 32


@pytest.fixture(scope="module")
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


@pytest.fixture(scope="module")
def routers(etcd, loop_thread):
    registry = ["--registry", etcd.url(PREFIX), "--liveness-timeout-s", "120"]
    # No admission at the routers' front door: the decode instances' refusals are all that
    # keeps the KV asked for within their pools.
    routing = ["--kv-admission-ratio", "0", "--kv-wait-s", "20"]
    processes = ProcessCluster.from_argv(
        [
            *registry,
            "--num-decode",
            "2",
            "--transport",
            "tcp",
            "--http-port",
            "0",
            "--torch-threads",
            "1",
            *ENGINE_ARGV,
            "--num-blocks",
            str(NUM_BLOCKS),
            "--max-model-len",
            str(NUM_BLOCKS * 16),
            *routing,
        ]
    )
    second: Process | None = None
    clients: list[ClusterClient] = []
    try:
        loop_thread.run(processes.start(), timeout=240)
        secret = processes.configs.process.cluster_secret
        second = Process(["--role", "router", "--port", "0", *registry, *routing], secret)
        clients.append(loop_thread.run(processes.client()))
        host, port = second.address
        clients.append(loop_thread.run(ClusterClient.connect(host, port, timeout=30, secret=processes.cluster_secret)))
        yield clients
    finally:
        for client in clients:
            loop_thread.run(client.close())
        if second is not None:
            second.stop()
        loop_thread.run(processes.stop(), timeout=120)


async def served(client: ClusterClient, prompt: list[int]) -> Completion:
    return Completion([out async for out in client.generate(prompt, greedy(OUTPUT))])


def test_two_routers_overasking_one_decode_pool_get_exact_tokens_or_overloaded(routers, colocated, loop_thread):
    prompts = load_prompts(seed=21, num=2 * PER_ROUTER, min_len=40, max_len=120)
    expected = loop_thread.run(complete_all(colocated, prompts, [OUTPUT] * len(prompts)))

    async def through_both():
        return await asyncio.gather(
            *(served(routers[i % 2], prompt) for i, prompt in enumerate(prompts)), return_exceptions=True
        )

    actual = loop_thread.run(through_both(), timeout=300)
    completed = 0
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert isinstance(a, Completion), f"request {i} raised {a!r}"
        last = a.outputs[-1]
        if last.error is not None:  # only overload may end a request here: the pools are full, not broken
            assert "overloaded" in last.error, f"request {i}: {last.error}"
            continue
        assert last.finish_reason == "length" and a.token_ids == e.token_ids, f"request {i}"
        completed += 1
    assert completed >= len(prompts) // 2, f"only {completed} of {len(prompts)} completed"
    decodes = {a.outputs[-1].transfer.decode_instance for a in actual if a.outputs[-1].transfer is not None}
    assert decodes == {"decode-0", "decode-1"}, decodes
    for client in routers:  # every pool full again, as each router sees it
        stats = loop_thread.run(client.stats(settle=True))
        refused = {s.instance_id: s.num_refused_reservations for s in stats}
        assert refused["decode-0"] + refused["decode-1"] > 0, f"the load must overfill the decode pools: {refused}"
        assert {s.instance_id for s in stats} == {"prefill-0", "decode-0", "decode-1"}, stats
        assert all(
            s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_running == 0 and s.num_fencing_blocks == 0
            for s in stats
        ), stats
