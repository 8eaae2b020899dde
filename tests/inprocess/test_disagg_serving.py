"""Disaggregated serving in one process (loopback KV transport, real TCP control plane)."""

from __future__ import annotations

import asyncio
import struct

import msgspec
import pytest
from disagg_helpers import (
    BLOCK_SIZE,
    CONFIG,
    LOCAL_PREFILL_MAX_TOKENS,
    SHARED_PREFIX_LEN,
    assert_same_tokens,
    first_wave,
    prefix_wave,
    run_all,
    two_prefill_cluster,
)

from minipd.control.channel import RemoteError
from minipd.control.handshake import open_channel
from minipd.control.messages import Prefill, Register, Reserve
from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.engine.engine import Engine
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.control_port import RouterControlPort
from minipd.router.registry import IncompatibleInstance
from minipd.router.router_config import RouterConfig

# Long enough that no prefill here outlasts it on a loaded 2-core runner (0.3 s expired mid-prefill
# in a full run), short enough that the expiry test stays quick.
LEASE_S = 1.5


@pytest.fixture(scope="module")
def cluster(loop_thread):
    cluster = loop_thread.run(
        InProcessCluster.start(
            CONFIG,
            num_prefill=1,
            num_decode=1,
            router_config=RouterConfig(local_prefill_max_tokens=LOCAL_PREFILL_MAX_TOKENS),
            lease_s=LEASE_S,
        )
    )
    yield cluster
    loop_thread.run(cluster.close())


@pytest.fixture(scope="module")
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


@pytest.fixture(autouse=True)
def cluster_pools_full(cluster, loop_thread):
    yield
    for instance in cluster.instances:
        loop_thread.run(instance.engine.wait_idle(10.0))
        stats = instance.stats()
        assert stats.num_used_blocks == 0 and stats.num_reservations == 0, stats


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_disaggregated_equals_colocated(cluster, colocated, loop_thread, kind):
    prompts = first_wave(seed=10 if kind == "greedy" else 20)  # fresh prompts: no prefix hits here
    expected = loop_thread.run(run_all(colocated, prompts, kind))
    actual = loop_thread.run(run_all(cluster, prompts, kind))
    assert_same_tokens(expected, actual, prompts)
    local = [a for a, p in zip(actual, prompts) if len(p) <= LOCAL_PREFILL_MAX_TOKENS]
    remote = [a for a, p in zip(actual, prompts) if len(p) > LOCAL_PREFILL_MAX_TOKENS]
    assert local and all(a.outputs[-1].transfer is None for a in local), "short prompts prefill on decode"
    block_bytes = kv_bytes_per_block(cluster)
    for a, p in zip(remote, [p for p in prompts if len(p) > LOCAL_PREFILL_MAX_TOKENS]):
        transfer = a.outputs[-1].transfer
        assert transfer is not None and transfer.prefill_instance == "prefill-0"
        sent_blocks = -(-len(p) // BLOCK_SIZE) - transfer.decode_cached_tokens // BLOCK_SIZE
        assert transfer.num_bytes == sent_blocks * block_bytes
        # the decode instance measured its adopt (wall clock: above 0, far below a step of the test)
        assert transfer.adopt_s is not None and 0 < transfer.adopt_s < 1.0, transfer


def kv_bytes_per_block(cluster) -> int:
    """Bytes of one block across all layers (what moves per block)."""
    pool = cluster.instance("decode-0").engine.kv_pool
    return pool[0, 0].numel() * pool.element_size() * pool.shape[0]


def test_prefix_hits_on_both_sides_send_only_missing_blocks(cluster, colocated, loop_thread):
    warm, prompts = prefix_wave()
    loop_thread.run(run_all(cluster, [warm], "greedy"))
    expected = loop_thread.run(run_all(colocated, prompts, "greedy"))
    actual = loop_thread.run(run_all(cluster, prompts, "greedy"))
    assert_same_tokens(expected, actual, prompts)
    shared_blocks = SHARED_PREFIX_LEN // BLOCK_SIZE
    block_bytes = kv_bytes_per_block(cluster)
    short, *longer = zip(actual, prompts)
    assert len(short[1]) - shared_blocks * BLOCK_SIZE <= LOCAL_PREFILL_MAX_TOKENS
    assert short[0].outputs[-1].transfer is None, "the decode instance holds all but a few tokens: local prefill"
    assert short[0].num_cached_tokens == shared_blocks * BLOCK_SIZE
    for a, p in longer:
        transfer = a.outputs[-1].transfer
        assert transfer.decode_cached_tokens == shared_blocks * BLOCK_SIZE
        assert transfer.prefill_cached_tokens == shared_blocks * BLOCK_SIZE
        assert transfer.num_bytes == (-(-len(p) // BLOCK_SIZE) - shared_blocks) * block_bytes


def test_unused_reservation_expires_and_is_freed(cluster, loop_thread):
    decode = cluster.router.registry.instances["decode-0"]
    instance = cluster.instance("decode-0")

    async def reserve_and_wait():
        reserved = await decode.channel.call(
            Reserve(request_id="never-prefilled", token_ids=list(range(40)), prefill_instance="prefill-0")
        )
        held = instance.stats().num_used_blocks
        expired = await asyncio.wait_for(_next_expiry_of(instance, "never-prefilled"), 10 * LEASE_S + 5)
        return reserved, held, expired

    reserved, held, expired = loop_thread.run(reserve_and_wait())
    assert len(reserved.dst_block_ids) == 3 and held == 3 and expired == "never-prefilled"


async def _next_expiry_of(instance, request_id: str) -> str:
    """The queue keeps every expiry of the module's instance; skip those of other requests."""
    while (expired := await instance.expired_leases.get()) != request_id:
        pass
    return expired


def test_abort_midway_frees_both_pools(cluster, loop_thread):
    async def abort_after_first_token():
        stream = cluster.submit(list(range(100)), SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
        first = await stream.__anext__()
        stream.abort()
        return first, [o async for o in stream]

    first, rest = loop_thread.run(abort_after_first_token())
    assert first.token_ids and rest[-1].finish_reason == "abort"


def test_fingerprint_mismatch_is_refused_naming_the_difference(cluster, loop_thread):
    async def add_mismatched():
        config = msgspec.structs.replace(CONFIG, block_size=2 * BLOCK_SIZE)
        instance = await Instance.create(Engine(config), Role.DECODE, "odd-one", "loopback", "tiny")
        await instance.serve("127.0.0.1", 0)
        try:
            with pytest.raises(IncompatibleInstance) as info:
                await cluster.router.add_instance("127.0.0.1", instance.port)
            return str(info.value)
        finally:
            await instance.close()

    message = loop_thread.run(add_mismatched())
    assert f"block_size: {2 * BLOCK_SIZE} != {BLOCK_SIZE}" in message and "odd-one" in message
    assert "odd-one" not in cluster.router.registry.instances


def test_prefill_refuses_a_decode_with_another_fingerprint(cluster, loop_thread):
    prefill = cluster.router.registry.instances["prefill-0"]
    decode = cluster.router.registry.instances["decode-0"]
    odd = msgspec.structs.replace(decode.welcome.fingerprint, dtype="bfloat16", weights="quantized")

    async def prefill_for_odd_decode():
        with pytest.raises(RemoteError) as info:
            await prefill.channel.call(
                Prefill(
                    request_id="odd",
                    token_ids=list(range(40)),
                    sampling=SamplingParams(temperature=0.0),
                    decode_instance="decode-0",
                    decode_description=decode.welcome.transport_description,
                    decode_fingerprint=odd,
                    dst_block_ids=[0, 1, 2],
                    num_skip_blocks=0,
                )
            )
        return str(info.value)

    message = loop_thread.run(prefill_for_odd_decode())
    assert "dtype: 'float32' != 'bfloat16'" in message and "weights: 'dense' != 'quantized'" in message


def test_instances_can_register_with_the_router_port(cluster, loop_thread):
    async def register_and_route():
        server = RouterControlPort(cluster.router)
        port = await server.serve("127.0.0.1", 0)
        late = await Instance.create(
            Engine(CONFIG),
            Role.PREFILL,
            "late-prefill",
            "loopback",
            "tiny",
            {"hub": cluster.instances[0].transport._hub},
        )
        odd = await Instance.create(
            Engine(msgspec.structs.replace(CONFIG, block_size=2 * BLOCK_SIZE)),
            Role.DECODE,
            "odd-decode",
            "loopback",
            "tiny",
        )
        try:
            for instance in (late, odd):
                await instance.serve("127.0.0.1", 0)
            channel, _ = await open_channel("127.0.0.1", port, None, "test", Role.PREFILL, None, 10)
            registered = await channel.call(Register(host="127.0.0.1", port=late.port))
            await channel.close()
            channel, _ = await open_channel("127.0.0.1", port, None, "test", Role.DECODE, None, 10)
            with pytest.raises(RemoteError) as refused:
                await channel.call(Register(host="127.0.0.1", port=odd.port))
            await channel.close()
            return registered, str(refused.value), sorted(cluster.router.registry.instances)
        finally:
            for instance in (late, odd):
                await instance.close()
            await server.close()

    registered, refused, ids = loop_thread.run(register_and_route())
    assert registered.instance_id == "late-prefill" and "late-prefill" in ids
    assert "block_size" in refused and "odd-decode" not in ids


def test_router_prefers_the_prefill_instance_holding_the_prefix_and_spreads_load(loop_thread):
    async def run():
        async with await two_prefill_cluster() as two:
            greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
            spread = await asyncio.gather(*(_transfer(two, [k] * 60 + list(range(20)), greedy) for k in range(4)))
            base = list(range(100, 180))
            first = await _transfer(two, base, greedy)
            again = [await _transfer(two, base + [50 + i] * 20, greedy) for i in range(3)]
            return spread, first, again

    spread, first, again = loop_thread.run(run())
    assert {t.prefill_instance for t in spread} == {"prefill-0", "prefill-1"}, "concurrent load is spread"
    assert all(t.prefill_instance == first.prefill_instance for t in again), "the prefix holder is preferred"
    assert all(t.prefill_cached_tokens == 5 * BLOCK_SIZE for t in again)


async def _transfer(cluster, prompt, params):
    outputs = [o async for o in cluster.generate(prompt, params)]
    return outputs[-1].transfer


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


@pytest.mark.parametrize(
    "frame",
    [
        _frame(b"\xc1garbage"),  # not msgpack
        struct.pack(">I", 2**31),  # over the frame cap
        _frame(msgspec.msgpack.encode({"type": "nope"})),  # not a known message
        _frame(msgspec.msgpack.encode({"type": "reserve", "token_ids": "not a list", "prefill_instance": 3})),
    ],
    ids=["not-msgpack", "oversize", "unknown-type", "wrong-types"],
)
def test_malformed_control_frames_close_only_that_connection(cluster, loop_thread, frame):
    async def send_garbage_then_serve():
        instance = cluster.instance("decode-0")
        reader, writer = await asyncio.open_connection("127.0.0.1", instance.port)
        writer.write(frame)
        await writer.drain()
        eof = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        outputs = [o async for o in cluster.generate(list(range(60)), SamplingParams(max_tokens=3, temperature=0.0))]
        return eof, outputs[-1]

    eof, last = loop_thread.run(send_garbage_then_serve())
    assert eof == b"", "the instance closes a connection that sent a bad frame"
    assert last.finished and last.error is None and last.num_output_tokens == 3


def test_requests_wait_for_a_full_decode_pool_instead_of_failing(loop_thread):
    # 12 decode blocks: three 90-token prompts (6 blocks each, then growth) cannot all hold blocks at once.
    # KV admission off: the router accepts them all and the third waits for blocks.
    small_decode = CONFIG.replace(num_blocks=12, max_model_len=190)
    router_config = RouterConfig(local_prefill_max_tokens=-1, kv_admission_ratio=None)

    async def run():
        async with await InProcessCluster.start(small_decode, 1, 1, router_config) as c:
            prompts = [[k + 1] * 90 for k in range(3)]
            params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
            results = await asyncio.gather(*(_collect(c, p, params) for p in prompts))
            return results, [i.stats() for i in c.instances], c.router.counters.num_busy_waits

    results, stats, busy_waits = loop_thread.run(run(), timeout=120)
    assert busy_waits > 0, "the test must fill the decode pool"
    assert all(r[-1].error is None and r[-1].num_output_tokens == 40 for r in results)
    assert all(s.num_used_blocks == 0 for s in stats)


async def _collect(cluster, prompt, params):
    return [o async for o in cluster.generate(prompt, params)]
