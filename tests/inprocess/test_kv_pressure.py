"""A decode pool under more load than it holds: no deadlock, early refusals, bounded waits.

The load is the one that deadlocked a decode instance (1,024 blocks, 300 concurrent streams of
30-110-token prompts with max_tokens 50 and ignore_eos), scaled to the tiny model: 16 blocks
and 60 streams with max_tokens 30, which deadlocked it every time.
"""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import msgspec
import pytest
from engine_helpers import complete_all, greedy

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.engine_backend import EngineBackend
from minipd.api.router_backend import RouterBackend
from minipd.engine.engine import EngineConfig
from minipd.engine.kv_admission import NoCapacity, claim_blocks
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig

BLOCK_SIZE = 16
DECODE = EngineConfig.of(
    model="tiny", dtype="float32", block_size=BLOCK_SIZE, num_blocks=32, max_model_len=256, max_num_batched_tokens=256
)
SMALL_DECODE = msgspec.structs.replace(DECODE, num_blocks=16)  # one max_model_len sequence
NUM_STREAMS = 60
MAX_TOKENS = 30
LOAD_TIMEOUT_S = 60.0  # the load takes ~10 s here; a deadlock never ends
POLL_S = 0.005


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(30, 111))] for _ in range(count)]


async def _settled(cluster: InProcessCluster) -> list:
    for instance in cluster.instances:
        await instance.engine.wait_idle(10.0)
    return [instance.stats() for instance in cluster.instances]


def test_a_decode_pool_far_too_small_for_its_load_never_deadlocks(loop_thread, make_engine):
    # KV admission off, so every request reaches the decode pool: only the scheduler keeps it moving.
    load = prompts(seed=4, count=NUM_STREAMS)
    params = greedy(MAX_TOKENS)

    async def run():
        config = RouterConfig(local_prefill_max_tokens=0, kv_admission_ratio=None, kv_wait_s=LOAD_TIMEOUT_S)
        async with await InProcessCluster.start(SMALL_DECODE, 1, 1, config) as cluster:

            async def one(prompt):
                return [o async for o in cluster.generate(prompt, params)]

            results = await asyncio.wait_for(asyncio.gather(*(one(p) for p in load)), LOAD_TIMEOUT_S)
            return results, await _settled(cluster), cluster.instance("decode-0").engine.scheduler.num_preemptions

    results, stats, preemptions = loop_thread.run(run(), timeout=LOAD_TIMEOUT_S + 30)
    assert preemptions > 0, "the load must overflow the decode pool"
    assert all(r[-1].error is None and r[-1].num_output_tokens == MAX_TOKENS for r in results)
    # preempted requests were recomputed on the decode instance: their tokens are still exact
    roomy = msgspec.structs.replace(DECODE, num_blocks=NUM_STREAMS * DECODE.scheduler.max_model_len // BLOCK_SIZE)
    expected = loop_thread.run(complete_all(make_engine(**msgspec.structs.asdict(roomy)), load, params))
    assert [[t for o in r for t in o.token_ids] for r in results] == [e.token_ids for e in expected]
    assert all(s.num_used_blocks == 0 and s.num_reservations == 0 for s in stats), stats


def test_a_reservation_never_takes_blocks_that_queued_requests_need(loop_thread):
    async def run():
        async with await InProcessCluster.start(DECODE, 1, 1, RouterConfig(local_prefill_max_tokens=0)) as cluster:
            engine = cluster.instance("decode-0").engine
            others = engine.block_manager.reserve(DECODE.num_blocks - 10)  # held by other reservations
            stream = engine.submit(list(range(1, 100)), greedy(4))  # queued; holds nothing until it runs
            needed = engine.scheduler.num_blocks_needed()
            with pytest.raises(NoCapacity, match="queued requests need 7"):
                engine.reserve([7] * (3 * BLOCK_SIZE + 1))  # 10 free - 7 needed: 3 blocks spare, not 4
            block_ids, _ = engine.reserve([7] * (3 * BLOCK_SIZE))
            engine.release_blocks(block_ids + others)
            outputs = [o async for o in stream]
            return needed, outputs

    needed, outputs = loop_thread.run(run())
    assert needed == 7 and outputs[-1].num_output_tokens == 4 and outputs[-1].error is None


@pytest.fixture(params=["router", "colocated"])
def overload_server(request, loop_thread, make_engine):
    """An HTTP front over a 32-block decode pool, with KV admission at its default ratio (1)."""
    if request.param == "router":
        cluster = loop_thread.run(InProcessCluster.start(DECODE, 1, 1, RouterConfig(local_prefill_max_tokens=0)))
        backend = RouterBackend(cluster.router)
        pools = cluster.instances
    else:
        cluster, engine = None, make_engine(**msgspec.structs.asdict(DECODE))
        backend = EngineBackend(engine, "tiny")
        pools = []
    runner, port = loop_thread.run(
        start_http_server(build_app(backend, HttpConfig(max_waiting_requests=None)), "127.0.0.1", 0)
    )
    yield f"http://127.0.0.1:{port}", backend
    loop_thread.run(runner.cleanup())
    if cluster is not None:
        stats = loop_thread.run(_settled(cluster))
        loop_thread.run(cluster.close())
        assert all(s.num_used_blocks == 0 and s.num_reservations == 0 for s in stats), stats
    del pools


BURST_PROMPT_TOKENS = 40  # with BOS: 41 + 23 output tokens = 64 = 4 blocks claimed each
BURST_MAX_TOKENS = 23
BURST_FACTOR = 10


def test_a_burst_of_ten_times_capacity_is_refused_early_and_every_accepted_request_completes(
    overload_server, loop_thread
):
    url, backend = overload_server
    claim = claim_blocks(BURST_PROMPT_TOKENS + 1, BURST_MAX_TOKENS, DECODE.scheduler.max_model_len, BLOCK_SIZE)
    capacity = DECODE.num_blocks // claim  # requests whose whole output fits at once
    rng = random.Random(5)
    bodies = [
        {
            "prompt": "".join(chr(rng.randrange(97, 123)) for _ in range(BURST_PROMPT_TOKENS)),
            "max_tokens": BURST_MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "stream": i % 2 == 1,
        }
        for i in range(BURST_FACTOR * capacity)
    ]

    async def burst():
        peak = 0
        done = asyncio.Event()

        async def watch_claims():  # a measurement, sampled while the burst runs
            nonlocal peak
            claims = backend.router.kv_claims if isinstance(backend, RouterBackend) else backend.engine.kv_claims
            while not done.is_set():
                peak = max(peak, claims.total)
                await asyncio.sleep(POLL_S)

        async def one(session: aiohttp.ClientSession, body: dict):
            start = time.monotonic()
            async with session.post(f"{url}/v1/completions", json=body) as response:
                text = await response.text()
                return response.status, dict(response.headers), text, time.monotonic() - start

        watcher = asyncio.get_running_loop().create_task(watch_claims())
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(*(one(session, b) for b in bodies))
        done.set()
        await watcher
        return results, peak

    results, peak = loop_thread.run(burst(), timeout=LOAD_TIMEOUT_S)
    accepted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    assert len(refused) >= len(results) // 2, f"{len(accepted)} of {len(results)} accepted"
    for status, headers, text, _ in refused:
        assert status == 503 and headers["Retry-After"] == "1"
        assert msgspec.json.decode(text)["error"]["type"] == "overloaded_error" and "KV capacity" in text
    for _, headers, text, _ in accepted:  # each completed in full
        if headers["Content-Type"].startswith("text/event-stream"):
            events = [msgspec.json.decode(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            assert all("error" not in e for e in events)
            assert events[-1]["choices"][0]["finish_reason"] == "length"
        else:
            assert msgspec.json.decode(text)["usage"]["completion_tokens"] == BURST_MAX_TOKENS
    assert peak <= DECODE.num_blocks, "claims beyond the pool were admitted"
    # early: every refusal came back before any accepted request (24 model steps) had completed
    assert max(r[3] for r in refused) < min(r[3] for r in accepted)


def test_a_request_that_cannot_get_blocks_in_time_fails_as_overloaded_and_the_others_complete(loop_thread):
    # Admission off and a short KV wait: the third long request cannot reserve while two run.
    small = DECODE.replace(num_blocks=12, max_model_len=190)
    config = RouterConfig(local_prefill_max_tokens=-1, kv_admission_ratio=None, kv_wait_s=0.2)

    async def run():
        async with await InProcessCluster.start(small, 1, 1, config) as cluster:
            params = SamplingParams(max_tokens=90, temperature=0.0, ignore_eos=True)

            async def one(k):
                return [o async for o in cluster.generate([k + 1] * 90, params)]

            results = await asyncio.wait_for(asyncio.gather(*(one(k) for k in range(3))), LOAD_TIMEOUT_S)
            return results, await _settled(cluster)

    results, stats = loop_thread.run(run(), timeout=LOAD_TIMEOUT_S + 30)
    failed = [r[-1] for r in results if r[-1].error is not None]
    assert len(failed) >= 1 and all("overloaded" in f.error and "decode-0" in f.error for f in failed)
    assert all(r[-1].num_output_tokens == 90 for r in results if r[-1].error is None)
    assert all(s.num_used_blocks == 0 and s.num_reservations == 0 for s in stats), stats


def test_a_full_decode_instance_refuses_and_the_router_tries_the_other_at_once(loop_thread):
    # decode-0's blocks are taken behind the router's back (as another router's requests would
    # take them): its refusals send the requests to decode-1, none waits for decode-0 to drain.
    load = prompts(seed=6, count=6)

    async def run():
        config = RouterConfig(local_prefill_max_tokens=0, kv_admission_ratio=None, kv_wait_s=2.0)
        async with await InProcessCluster.start(DECODE, 1, 2, config) as cluster:
            full = cluster.instance("decode-0").engine
            held = full.block_manager.reserve(full.block_manager.num_free_blocks)

            async def one(prompt):
                return [o async for o in cluster.generate(prompt, greedy(4))]

            results = await asyncio.gather(*(one(p) for p in load))
            full.release_blocks(held)
            return results, await _settled(cluster), cluster.router.counters

    results, stats, counters = loop_thread.run(run(), timeout=LOAD_TIMEOUT_S)
    assert counters.num_busy_redirects > 0, "decode-0 must have been picked and have refused"
    assert counters.num_busy_waits == 0
    assert all(r[-1].error is None and r[-1].transfer.decode_instance == "decode-1" for r in results), results
    assert all(s.num_used_blocks == 0 and s.num_reservations == 0 for s in stats), stats
