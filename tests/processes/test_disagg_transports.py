"""Disaggregated serving across real processes, for every network transport."""

from __future__ import annotations

import asyncio
import signal

import msgspec
import pytest
from disagg_helpers import (
    BLOCK_SIZE,
    CONFIG,
    ENGINE_ARGV,
    LOCAL_PREFILL_MAX_TOKENS,
    ROUTER_ARGV,
    SHARED_PREFIX_LEN,
    assert_same_tokens,
    first_wave,
    prefix_wave,
    run_all,
)

from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.transports.backends import available_transports

NETWORK_TRANSPORTS = ["tcp", "ucx", "nixl"]
DEATH_TIMEOUT_S = 30.0


def _skip_unless_installed(transport: str):
    return pytest.mark.skipif(
        transport not in available_transports(),
        reason=f"the {transport} extra is not installed (pip install -e '.[{transport}]')",
    )


@pytest.fixture(scope="module", params=[pytest.param(t, marks=_skip_unless_installed(t)) for t in NETWORK_TRANSPORTS])
def cluster(request, loop_thread):
    processes = ProcessCluster.from_argv(["--transport", request.param, *ENGINE_ARGV, *ROUTER_ARGV])
    loop_thread.run(processes.start(), timeout=180)
    client = loop_thread.run(processes.client())
    yield processes, client
    loop_thread.run(client.close())
    loop_thread.run(processes.stop())


@pytest.fixture(scope="module")
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


@pytest.fixture(autouse=True)
def cluster_pools_full(request, loop_thread):
    yield
    if "cluster" not in request.fixturenames:
        return
    _, client = request.getfixturevalue("cluster")
    for stats in loop_thread.run(client.stats(settle=True)):
        assert stats.num_used_blocks == 0 and stats.num_reservations == 0, stats


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_disaggregated_equals_colocated(cluster, colocated, loop_thread, kind):
    _, client = cluster
    prompts = first_wave(seed=10 if kind == "greedy" else 20)
    expected = loop_thread.run(run_all(colocated, prompts, kind))
    actual = loop_thread.run(run_all(client, prompts, kind), timeout=120)
    assert_same_tokens(expected, actual, prompts)
    modes = [a.outputs[-1].transfer is None for a in actual]
    assert modes == [len(p) <= LOCAL_PREFILL_MAX_TOKENS for p in prompts], "short prompts prefill on decode"


def test_prefix_hits_send_only_missing_blocks(cluster, colocated, loop_thread):
    _, client = cluster
    warm, prompts = prefix_wave(seed=5)
    loop_thread.run(run_all(client, [warm], "greedy"))
    expected = loop_thread.run(run_all(colocated, prompts, "greedy"))
    actual = loop_thread.run(run_all(client, prompts, "greedy"))
    assert_same_tokens(expected, actual, prompts)
    shared = (SHARED_PREFIX_LEN // BLOCK_SIZE) * BLOCK_SIZE
    for a in actual[1:]:
        transfer = a.outputs[-1].transfer
        assert transfer.decode_cached_tokens == shared and transfer.prefill_cached_tokens == shared


def test_client_abort_frees_every_pool(cluster, loop_thread):
    _, client = cluster

    async def abort_after_first_token():
        stream = client.submit(list(range(90)), SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True))
        first = await stream.__anext__()
        stream.abort()
        return first, [o async for o in stream]

    first, rest = loop_thread.run(abort_after_first_token())
    assert first.token_ids and rest[-1].finished and rest[-1].finish_reason == "abort"


def test_bad_request_is_refused_and_the_cluster_keeps_serving(cluster, loop_thread):
    _, client = cluster
    refused = loop_thread.run(run_all(client, [[999999]], "greedy"))[0]
    assert refused.outputs[-1].error and "prompt_token_ids" in refused.outputs[-1].error
    ok = loop_thread.run(run_all(client, [list(range(30))], "greedy"))[0]
    assert len(ok.token_ids) == 10


@_skip_unless_installed("tcp")
def test_decode_death_ends_the_request_and_frees_the_prefill_pool(loop_thread):
    processes = ProcessCluster.from_argv(["--transport", "tcp", *ENGINE_ARGV, *ROUTER_ARGV])
    loop_thread.run(processes.start(), timeout=180)

    async def kill_decode_midway():
        client = await processes.client()
        try:
            stream = client.submit(list(range(90)), SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
            first = await stream.__anext__()
            processes.child("decode-0").process.send_signal(signal.SIGKILL)
            rest = await asyncio.wait_for(_drain(stream), DEATH_TIMEOUT_S)
            return first, rest, await client.stats(settle=True)
        finally:
            await client.close()

    try:
        first, rest, stats = loop_thread.run(kill_decode_midway(), timeout=DEATH_TIMEOUT_S + 30)
    finally:
        loop_thread.run(processes.stop())
    assert first.token_ids
    assert rest[-1].finished and rest[-1].finish_reason == "abort" and "decode-0" in (rest[-1].error or "")
    assert [s.instance_id for s in stats] == ["prefill-0"] and stats[0].num_used_blocks == 0


async def _drain(stream):
    return [o async for o in stream]
