"""The shared KV tier in a disaggregated cluster's request path, against a real Redis: turn 2 of
a conversation, with every local cache gone, is served with the tier's blocks (fewer prompt
tokens computed) and the same greedy tokens as without the tier; corrupted values are refused,
counted and computed instead; a store that is killed costs computing, never a request, and
hits come back once it is up again. Every pool returns to full after every request."""

from __future__ import annotations

import asyncio
import random

import pytest
from disagg_helpers import CONFIG
from engine_helpers import Completion, greedy
from kvtier_stores import RedisEnv, redis_missing

from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.kvtier.block_header import HEADER_BYTES

pytestmark = pytest.mark.skipif(redis_missing() is not None, reason=redis_missing() or "")

MAX_TOKENS = 8
# turn 1's prompt fills 5 blocks; with its generated tail (the last token's KV is never computed)
# 6: the 6th comes from the decode instance's store
TURN1 = 90
SETTLE_S = 10.0


@pytest.fixture(scope="module")
def redis():
    env = RedisEnv()
    yield env
    env.close()


@pytest.fixture(scope="module")
def cluster(redis, loop_thread):
    # fetches whatever the tier has (the tiny model computes faster than a store returns a block)
    start = InProcessCluster.start(CONFIG, num_prefill=2, num_decode=1, kv_tier=redis.url, kv_tier_fetch="always")
    c = loop_thread.run(start)
    yield c
    loop_thread.run(c.close())


@pytest.fixture(scope="module")
def reference(make_engine):
    """The same model without any tier or disaggregation: what every answer must be."""
    return make_engine(**{"model": "tiny", "dtype": "float32", "block_size": 16, "num_blocks": 256})


async def ask(server, prompt: list[int]) -> Completion:
    return Completion([out async for out in server.generate(prompt, greedy(MAX_TOKENS))])


async def forget_local_caches(cluster: InProcessCluster) -> None:
    """Let every store finish, check every pool is full, and forget every local prefix cache (as
    a restarted instance would)."""
    for instance in cluster.instances:
        assert await instance.tier_wire.drain(SETTLE_S)
        assert await instance.engine.wait_idle(SETTLE_S)
        assert await instance.reservations.wait_fenced(SETTLE_S)
        blocks = instance.engine.stats().blocks
        assert blocks.num_free == blocks.num_blocks, f"{instance.instance_id} leaked blocks: {blocks}"
        instance.engine.reset_pool()


def tier_hits(cluster: InProcessCluster) -> int:
    return sum(i.tier_wire.report().tier_hit_tokens for i in cluster.instances)


def conversation(seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(TURN1)], [rng.randrange(256) for _ in range(40)]


async def two_turns(cluster: InProcessCluster, seed: int) -> tuple[list[int], Completion]:
    """Turn 1, every local cache forgotten, then turn 2 (history and a new message)."""
    turn1, message = conversation(seed)
    first = await ask(cluster, turn1)
    assert first.outputs[-1].error is None
    await forget_local_caches(cluster)
    turn2 = turn1 + first.token_ids + message
    return turn2, await ask(cluster, turn2)


def test_turn_two_is_served_from_the_tier_with_the_same_tokens(cluster, reference, loop_thread):
    hits_before = tier_hits(cluster)
    turn2, second = loop_thread.run(two_turns(cluster, seed=0))
    assert second.outputs[-1].error is None
    # the whole history is in the tier: turn 1's prompt (prefill) and its generated tail (decode)
    assert tier_hits(cluster) - hits_before == 6 * 16
    expected = loop_thread.run(ask(reference, turn2))
    assert second.token_ids == expected.token_ids
    loop_thread.run(forget_local_caches(cluster))


def test_corrupted_values_are_refused_counted_and_computed(cluster, redis, reference, loop_thread):
    turn1, message = conversation(seed=1)
    first = loop_thread.run(ask(cluster, turn1))
    loop_thread.run(forget_local_caches(cluster))
    tier = cluster.instances[0].tier_wire.tier

    async def corrupt_all() -> int:
        keys = [k async for k in tier.backend.client.scan_iter(match="minipd-kv/*")]
        for key in keys:
            value = bytearray(await tier.backend.client.get(key))
            value[HEADER_BYTES + 3] ^= 0x40  # a valid header, one payload bit flipped
            await tier.backend.client.set(key, bytes(value))
        return len(keys)

    assert loop_thread.run(corrupt_all()) > 0
    failures_before = sum(i.tier_wire.report().verification_failures for i in cluster.instances)
    turn2 = turn1 + first.token_ids + message
    second = loop_thread.run(ask(cluster, turn2))
    assert second.outputs[-1].error is None and second.num_cached_tokens == 0
    assert sum(i.tier_wire.report().verification_failures for i in cluster.instances) > failures_before
    assert second.token_ids == loop_thread.run(ask(reference, turn2)).token_ids
    loop_thread.run(forget_local_caches(cluster))


def test_a_killed_store_costs_computing_and_hits_resume_once_it_is_back(cluster, redis, reference, loop_thread):
    redis.kill()
    try:
        turn2, second = loop_thread.run(two_turns(cluster, seed=2), timeout=120)
        assert second.outputs[-1].error is None and second.num_cached_tokens == 0
        assert second.token_ids == loop_thread.run(ask(reference, turn2)).token_ids
        loop_thread.run(forget_local_caches(cluster))
    finally:
        redis.restart()
    hits_before = tier_hits(cluster)
    _, second = loop_thread.run(two_turns(cluster, seed=3))
    assert second.outputs[-1].error is None
    assert tier_hits(cluster) > hits_before
    loop_thread.run(forget_local_caches(cluster))


def test_an_abort_while_fetching_frees_everything(cluster, redis, loop_thread):
    """The store black-holed: the prefill's fetch waits for the tier's bound; the request is
    aborted meanwhile; nothing is computed for it and every pool is full again."""
    turn1, _ = conversation(seed=4)
    loop_thread.run(ask(cluster, turn1))
    loop_thread.run(forget_local_caches(cluster))
    redis.freeze()
    try:

        async def abort_midway() -> None:
            stream = cluster.submit(turn1, greedy(MAX_TOKENS))
            first = asyncio.ensure_future(stream.__anext__())
            done, _ = await asyncio.wait([first], timeout=0.5)  # the fetch is bounded by 2 s
            assert not done, "answered while the store was black-holed and the fetch could not end"
            stream.abort()
            await asyncio.wait([first], timeout=SETTLE_S)

        loop_thread.run(abort_midway())
    finally:
        redis.thaw()
    loop_thread.run(forget_local_caches(cluster))
