"""Liveness, leases and timeouts inside one process (loopback KV, real TCP control plane):
the KV load failure policy, leases renewed by prefill progress and only by it, the inter-token
timeout, and a channel declaring a silent peer dead."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import msgspec
import pytest
from disagg_helpers import CONFIG, LOCAL_PREFILL_MAX_TOKENS

from minipd.control.channel import Channel, serve
from minipd.engine.request import INSTANCE_LOST
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig
from minipd.transports import fault_points

LEASE_S = 0.3
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
BOUND_S = 20.0


def _prompt(seed: int, length: int = 200) -> list[int]:
    return [random.Random(seed).randrange(256) for _ in range(length)]


async def _collect(stream) -> list:
    return [output async for output in stream]


async def _cluster(lease_s: float = LEASE_S, transport_options: dict | None = None, **router) -> InProcessCluster:
    config = RouterConfig(local_prefill_max_tokens=LOCAL_PREFILL_MAX_TOKENS, **router)
    return await InProcessCluster.start(
        CONFIG, num_prefill=1, num_decode=1, router_config=config, lease_s=lease_s, transport_options=transport_options
    )


async def _assert_pools_full(cluster: InProcessCluster) -> None:
    for instance in cluster.instances:
        await instance.engine.wait_idle(BOUND_S)
        await instance.reservations.wait_fenced(BOUND_S)
        stats = instance.stats()
        assert stats.num_used_blocks == 0 and stats.num_reservations == 0 and stats.num_fencing_blocks == 0, stats


@pytest.fixture
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_stalled_transfer_loses_its_lease_and_follows_the_kv_load_failure_policy(loop_thread, colocated, policy):
    prompt = _prompt(11)

    async def scenario():
        cluster = await _cluster(kv_load_failure=policy)
        try:
            fault_points.arm("kv.mid_payload", "stall")  # the prefill's second layer write waits: no progress
            outputs = await asyncio.wait_for(_collect(cluster.submit(prompt, PARAMS)), BOUND_S)
            expired = cluster.instance("decode-0").expired_leases.get_nowait()
            fault_points.release("kv.mid_payload")
            await _assert_pools_full(cluster)
            return outputs, expired, cluster.router.counters.num_recomputes
        finally:
            fault_points.release("kv.mid_payload")
            await cluster.close()

    outputs, expired, recomputes = loop_thread.run(scenario(), timeout=2 * BOUND_S)
    assert expired.partition("@")[0] == outputs[-1].request_id  # the id of the try whose lease ran out
    last = outputs[-1]
    if policy == "recompute":
        expected = loop_thread.run(_collect(colocated.generate(prompt, PARAMS)))
        assert last.error is None and recomputes == 1
        assert [t for o in outputs for t in o.token_ids] == [t for o in expected for t in o.token_ids]
        assert last.transfer is None  # prefilled on the decode instance
    else:
        assert recomputes == 0 and last.finish_reason == "abort"
        assert "did not load" in last.error and "decode-0" in last.error and "expired" in last.error, last.error


def test_a_long_prefill_keeps_its_reservation_while_it_progresses(loop_thread):
    prompt = _prompt(12, 480)  # 30 blocks, ~1 MiB of KV: over a second at this link rate
    lease_s = 1.0

    async def scenario():
        cluster = await _cluster(lease_s=lease_s, transport_options={"link_gbps": 0.004})
        try:
            start = time.monotonic()
            outputs = await asyncio.wait_for(_collect(cluster.submit(prompt, PARAMS)), BOUND_S)
            elapsed = time.monotonic() - start
            await _assert_pools_full(cluster)
            return outputs, elapsed, cluster.router.counters.num_recomputes, cluster.instance("decode-0").expired_leases
        finally:
            await cluster.close()

    outputs, elapsed, recomputes, expired = loop_thread.run(scenario(), timeout=2 * BOUND_S)
    assert elapsed > lease_s, "the transfer was too quick to test renewals"
    assert outputs[-1].error is None and outputs[-1].transfer is not None, outputs[-1]
    assert recomputes == 0 and expired.empty()


def test_a_stream_that_stops_fails_after_the_inter_token_timeout(loop_thread):
    timeout_s = 0.5

    async def scenario():
        cluster = await _cluster(inter_token_timeout_s=timeout_s)
        decode = cluster.instance("decode-0")
        unblock = threading.Event()
        run_step = decode.engine.runner.execute
        try:
            stream = cluster.submit(_prompt(13), SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
            first = await asyncio.wait_for(stream.__anext__(), BOUND_S)

            def wedged(*args):  # the decode engine's compute hangs; its event loop (heartbeats) does not
                unblock.wait(BOUND_S)
                return run_step(*args)

            decode.engine.runner.execute = wedged
            started = time.monotonic()
            rest = await asyncio.wait_for(_collect(stream), BOUND_S)
            waited = time.monotonic() - started
        finally:
            unblock.set()
            decode.engine.runner.execute = run_step
        await _assert_pools_full(cluster)
        await cluster.close()
        return first, rest, waited

    first, rest, waited = loop_thread.run(scenario(), timeout=2 * BOUND_S)
    assert first.token_ids and rest[-1].finish_reason == "abort"
    assert "no output from decode-0" in rest[-1].error and "inter-token" in rest[-1].error, rest[-1].error
    assert rest[-1].error_kind == INSTANCE_LOST  # what the HTTP API answers as a 502 naming it
    assert timeout_s <= waited < BOUND_S


def test_a_channel_declares_a_silent_peer_dead_within_the_bound(loop_thread):
    timeout_s = 0.3

    async def scenario():
        accepted: asyncio.Queue[Channel] = asyncio.Queue()
        server = await serve("127.0.0.1", 0, accepted.put_nowait, "silent")
        try:
            port = server.sockets[0].getsockname()[1]
            watcher = await Channel.connect("127.0.0.1", port, None, "watcher")
            peer = await accepted.get()  # it never heartbeats: silent
            declared = asyncio.get_running_loop().create_future()
            start = time.monotonic()
            watcher.watch_liveness(timeout_s, timeout_s, on_silent=declared.set_result)
            reason = await asyncio.wait_for(declared, BOUND_S)
            elapsed = time.monotonic() - start
            await watcher.close()
            await peer.close()
            return reason, elapsed
        finally:
            server.close()

    reason, elapsed = loop_thread.run(scenario())
    assert "no frame from the peer" in reason
    assert timeout_s <= elapsed <= timeout_s * 3


def test_a_retry_on_the_same_prefill_instance_is_a_new_request_there(loop_thread, monkeypatch):
    """The decode instance dies mid-transfer: the retry goes to the other one, through the same
    prefill instance, which aborted the first try; it must not take the retry for that try."""
    reached = asyncio.Event()
    monkeypatch.setattr(fault_points, "announce", lambda point, detail: loop_thread.loop.call_soon(reached.set))

    async def scenario():
        config = RouterConfig(local_prefill_max_tokens=LOCAL_PREFILL_MAX_TOKENS)
        cluster = await InProcessCluster.start(CONFIG, num_prefill=1, num_decode=2, router_config=config)
        try:
            fault_points.arm("kv.mid_payload", "stall")
            stream = cluster.submit(_prompt(14), PARAMS)
            await asyncio.wait_for(reached.wait(), BOUND_S)
            victim = next(i for i in cluster.instances if i.stats().num_reservations)
            await victim.close()  # it dies: its connections close
            fault_points.release("kv.mid_payload")
            outputs = await asyncio.wait_for(_collect(stream), BOUND_S)
            survivors = [i for i in cluster.instances if i is not victim]
            for instance in survivors:
                await instance.engine.wait_idle(BOUND_S)
            return outputs, victim.instance_id, [i.stats() for i in survivors], cluster.router.counters.num_recomputes
        finally:
            fault_points.release("kv.mid_payload")
            await cluster.router.close()
            for instance in cluster.instances:
                await instance.close()

    outputs, victim, stats, recomputes = loop_thread.run(scenario(), timeout=2 * BOUND_S)
    last = outputs[-1]
    assert last.error is None and last.num_output_tokens == PARAMS.max_tokens, last
    assert recomputes == 0 and last.transfer is not None
    assert last.transfer.prefill_instance == "prefill-0" and last.transfer.decode_instance != victim
    assert all(s.num_used_blocks == 0 and s.num_reservations == 0 for s in stats), stats
