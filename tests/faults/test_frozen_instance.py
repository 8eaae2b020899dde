"""One frozen instance must not freeze the cluster (reproduced as reported: a hand-built cluster
of two prefill instances and one decode instance over TCP, and SIGSTOP on one of them).

With the default liveness timeout: the router's view stays fresh while an instance is frozen,
the frozen instance is declared dead within the bound and gets no new requests, a stream on a
frozen decode instance ends with a clear error, and a request whose prefill instance freezes
mid-transfer completes on the healthy decode instance.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

import pytest
from disagg_helpers import ENGINE_ARGV, ROUTER_ARGV

from minipd.control.channel import DEFAULT_LIVENESS_TIMEOUT_S
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.router.cluster_client import ClusterClient

LEASE_S = 3.0
# Slow enough that a prompt's KV takes seconds to move, so a freeze lands mid-transfer.
LINK_GBPS = 0.005
STATS_BOUND_S = 5.0  # the router answers for its instances within this, whatever one of them does
BOUND_S = DEFAULT_LIVENESS_TIMEOUT_S + 10.0  # a frozen instance's requests end (or complete elsewhere) within this
LONG = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def cluster(loop_thread):
    processes = ProcessCluster.from_argv(
        [
            "--transport",
            "tcp",
            "--num-prefill",
            "2",
            "--num-decode",
            "1",
            "--lease-s",
            str(LEASE_S),
            "--link-gbps",
            str(LINK_GBPS),
            *ENGINE_ARGV,
            *ROUTER_ARGV,
        ]
    )
    loop_thread.run(processes.start(), timeout=180)
    client = loop_thread.run(processes.client())
    yield processes, client
    for child in processes.children:
        if child.process.returncode is None:
            os.kill(child.process.pid, signal.SIGCONT)
    loop_thread.run(client.close())
    loop_thread.run(processes.stop())


@pytest.fixture(autouse=True)
def every_instance_back_and_every_pool_full(cluster, loop_thread):
    yield
    _, client = cluster
    stats = loop_thread.run(client.stats(settle=True))
    assert sorted(s.instance_id for s in stats) == ["decode-0", "prefill-0", "prefill-1"], stats
    for s in stats:
        assert s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_fencing_blocks == 0, s


def _signal(processes: ProcessCluster, name: str, sig: signal.Signals) -> None:
    os.kill(processes.child(name).process.pid, sig)


async def _collect(stream) -> list:
    return [output async for output in stream]


async def _resume_and_rejoin(processes: ProcessCluster, client: ClusterClient, name: str) -> None:
    _signal(processes, name, signal.SIGCONT)
    await processes.rejoin(name)


async def _until_gone(client: ClusterClient, name: str, timeout: float) -> float:
    """Wait until the router no longer lists `name`; returns how long that took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while name in [s.instance_id for s in await asyncio.wait_for(client.stats(), STATS_BOUND_S)]:
        assert loop.time() - start < timeout, f"{name} still listed after {timeout} s"
        await asyncio.sleep(0.1)  # condition poll, bounded
    return loop.time() - start


def test_a_frozen_prefill_instance_is_declared_dead_and_gets_no_new_requests(cluster, loop_thread):
    processes, client = cluster

    async def scenario():
        _signal(processes, "prefill-0", signal.SIGSTOP)
        try:
            view = await asyncio.wait_for(client.stats(), STATS_BOUND_S)  # not stuck behind the frozen one
            declared_after = await _until_gone(client, "prefill-0", BOUND_S)
            finished = await asyncio.wait_for(
                asyncio.gather(*(_collect(client.submit(list(range(i, i + 100)), SHORT)) for i in range(3))), BOUND_S
            )
        finally:
            await _resume_and_rejoin(processes, client, "prefill-0")
        return view, declared_after, finished

    view, declared_after, finished = loop_thread.run(scenario(), timeout=3 * BOUND_S)
    assert {"decode-0", "prefill-1"} <= {s.instance_id for s in view}
    assert declared_after <= BOUND_S
    for outputs in finished:
        last = outputs[-1]
        assert last.error is None and last.num_output_tokens == SHORT.max_tokens
        assert last.transfer is not None and last.transfer.prefill_instance == "prefill-1"


def test_a_stream_on_a_frozen_decode_instance_ends_with_a_clear_error(cluster, loop_thread):
    processes, client = cluster

    async def scenario():
        stream = client.submit(list(range(100)), LONG)
        first = await asyncio.wait_for(stream.__anext__(), BOUND_S)
        _signal(processes, "decode-0", signal.SIGSTOP)
        try:
            rest = await asyncio.wait_for(_collect(stream), BOUND_S)
            refused = await asyncio.wait_for(_collect(client.submit(list(range(50)), SHORT)), BOUND_S)
        finally:
            await _resume_and_rejoin(processes, client, "decode-0")
        return first, rest, refused

    first, rest, refused = loop_thread.run(scenario(), timeout=3 * BOUND_S)
    assert first.token_ids
    assert rest[-1].finish_reason == "abort" and "decode-0" in (rest[-1].error or ""), rest[-1]
    assert refused[-1].error and "no decode instance" in refused[-1].error


def test_a_request_whose_prefill_instance_freezes_mid_transfer_completes_on_the_healthy_decode(cluster, loop_thread):
    processes, client = cluster

    async def scenario():
        stream = client.submit([random.Random(3).randrange(256) for _ in range(400)], SHORT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BOUND_S
        # Mid-transfer: decode holds the reservation and a prefill instance holds the prompt's
        # blocks (the reservation comes first, so waiting for it alone can see no prefill yet).
        while True:
            stats = await client.stats()
            reserved = any(s.num_reservations for s in stats if s.instance_id == "decode-0")
            prefilling = [s.instance_id for s in stats if s.role.value == "prefill" and s.num_used_blocks]
            if reserved and prefilling:
                break
            assert loop.time() < deadline, "the request never reached a prefill instance mid-transfer"
            await asyncio.sleep(0.005)  # condition poll, bounded
        frozen = prefilling[0]
        _signal(processes, frozen, signal.SIGSTOP)
        try:
            outputs = await asyncio.wait_for(_collect(stream), BOUND_S)
            await _until_gone(client, frozen, BOUND_S)
        finally:
            await _resume_and_rejoin(processes, client, frozen)
        return outputs

    outputs = loop_thread.run(scenario(), timeout=3 * BOUND_S)
    assert outputs[-1].error is None, outputs[-1].error
    assert outputs[-1].num_output_tokens == SHORT.max_tokens
