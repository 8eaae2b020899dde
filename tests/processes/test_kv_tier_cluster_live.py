"""`minipd --role cluster --kv-tier mooncake`: the launcher's own Mooncake master and real
instance processes. Turn 2 of a conversation whose turn 1 was evicted from every local cache
is served with the tier's blocks and the same greedy tokens as a model without any tier; the
master killed mid-run costs computing, never a request, no block stays held, and hits come
back once the launcher has restarted it."""

from __future__ import annotations

import asyncio
import random

import pytest
from engine_helpers import Completion, greedy
from kvtier_stores import ALWAYS_FETCH, mooncake_missing

from minipd.entrypoints.process_cluster import ProcessCluster

pytestmark = pytest.mark.skipif(mooncake_missing() is not None, reason=mooncake_missing() or "")

BLOCK_SIZE = 16
NUM_BLOCKS = 24  # small pools: three filler prompts evict a conversation from every local cache
ENGINE = dict(model="tiny", dtype="float32", block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, max_model_len=256)
ARGV = [
    *("--model", "tiny", "--dtype", "float32", "--block-size", str(BLOCK_SIZE), "--num-blocks", str(NUM_BLOCKS)),
    *("--max-model-len", "256", "--max-num-batched-tokens", "64", "--kv-tier", "mooncake", *ALWAYS_FETCH),
]
MAX_TOKENS = 8
RESUME_TIMEOUT_S = 60.0
START_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def cluster(loop_thread):
    processes = ProcessCluster.from_argv(ARGV)
    loop_thread.run(processes.start(), timeout=START_TIMEOUT_S)
    client = loop_thread.run(processes.client())
    yield processes, client
    loop_thread.run(client.close())
    loop_thread.run(processes.stop(), timeout=120)


@pytest.fixture(scope="module")
def reference(make_engine):
    return make_engine(**ENGINE)


@pytest.fixture(autouse=True)
def pools_full_after(cluster, loop_thread):
    yield
    _, client = cluster
    for stats in loop_thread.run(client.stats(settle=True)):
        assert stats.num_used_blocks == 0 and stats.num_reservations == 0, stats


async def ask(server, prompt: list[int]) -> Completion:
    return Completion([out async for out in server.generate(prompt, greedy(MAX_TOKENS))])


async def tier_hits(client) -> int:
    return sum(s.kv_tier.tier_hit_tokens for s in await client.stats(settle=True))


async def conversation(client, seed: int) -> tuple[list[int], Completion]:
    """Turn 1, three unrelated prompts that evict it from every pool, then turn 2."""
    rng = random.Random(seed)
    turn1 = [rng.randrange(256) for _ in range(90)]
    first = await ask(client, turn1)
    assert first.outputs[-1].error is None
    for _ in range(3):
        filler = await ask(client, [rng.randrange(256) for _ in range(150)])
        assert filler.outputs[-1].error is None
    turn2 = turn1 + first.token_ids + [rng.randrange(256) for _ in range(30)]
    return turn2, await ask(client, turn2)


def test_turn_two_after_eviction_comes_from_the_tier_with_the_same_tokens(cluster, reference, loop_thread):
    processes, client = cluster
    assert processes.tier_master is not None and processes.tier_master.master.process.poll() is None
    before = loop_thread.run(tier_hits(client))
    turn2, second = loop_thread.run(conversation(client, seed=0), timeout=120)
    assert second.outputs[-1].error is None
    assert loop_thread.run(tier_hits(client)) - before >= 5 * BLOCK_SIZE  # turn 1's prompt at least
    assert second.token_ids == loop_thread.run(ask(reference, turn2)).token_ids
    reports = [s.kv_tier for s in loop_thread.run(client.stats())]
    assert all(r is not None and r.bytes_stored > 0 for r in reports)


def test_the_master_killed_costs_computing_and_hits_resume_after_its_restart(cluster, reference, loop_thread):
    processes, client = cluster
    master = processes.tier_master
    dead = master.master.process
    dead.kill()
    dead.wait(10)
    turn2, second = loop_thread.run(conversation(client, seed=1), timeout=120)
    assert second.outputs[-1].error is None
    assert second.token_ids == loop_thread.run(ask(reference, turn2)).token_ids

    async def hits_resume() -> bool:
        """Conversations until one gets tier hits (the launcher restarts the master, the
        instances' clients find it again), within RESUME_TIMEOUT_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESUME_TIMEOUT_S
        seed = 100
        while loop.time() < deadline:
            before = await tier_hits(client)
            _, answer = await conversation(client, seed)
            assert answer.outputs[-1].error is None
            if await tier_hits(client) > before:
                return True
            seed += 1
        return False

    assert loop_thread.run(hits_resume(), timeout=RESUME_TIMEOUT_S + 120)
    assert master.restarts >= 1 and master.master.process is not dead
