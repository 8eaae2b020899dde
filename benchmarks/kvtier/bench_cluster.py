"""The instances the `kvtier` benches place requests on, with or without the shared KV tier.

`instances(...)` starts `count` engines (small pools, block size `BLOCK_SIZE`, one torch thread
each) and, for a tier arm, one `TierWire` each over one store: the URL's (a redis-server the
bench started) or, without a URL, one in-process fake shared by all. Everything is closed on
exit, the tier's wires first. `serve_one` is one request as an instance serves it: the tier's
fetch first (when there is a wire), then the engine, timed from before the fetch.
"""

from __future__ import annotations

import importlib.util
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from benchmarks.kvtier.kvtier_bench import REDIS_SERVER
from minipd.disagg.fingerprint import engine_fingerprint, kv_tier_digest
from minipd.disagg.tier_wire import TierWire
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.sampling_params import SamplingParams
from minipd.kvtier.fake_backend import FakeBackend
from minipd.kvtier.fetch_cost import fetch_choice
from minipd.kvtier.open_tier import open_kv_tier
from minipd.kvtier.pool_buffers import pool_block_bytes
from minipd.kvtier.tier import KVTier

BLOCK_SIZE = 16


def default_store(store: str | None) -> str:
    """`store` as chosen, else redis when its server and client are installed, else fake."""
    installed = importlib.util.find_spec("redis") is not None and os.path.exists(REDIS_SERVER)
    return store or ("redis" if installed else "fake")


@asynccontextmanager
async def instances(
    model: str, num_blocks: int, max_model_len: int, count: int, tier: bool, url: str | None, fetch: str = "auto"
) -> AsyncIterator[tuple[list[Engine], list[TierWire | None]]]:
    """`count` started engines and their wires (all None unless `tier`), fetching as `fetch`
    says (`--kv-tier-fetch`); the tiny model in float32, so its greedy tokens do not depend on the batch."""
    config = EngineConfig.of(
        model=model,
        dtype="float32" if model == "tiny" else "auto",
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        torch_threads=1,
    )
    engines = [Engine(config) for _ in range(count)]
    wires: list[TierWire | None] = [None] * count
    try:
        for engine in engines:
            await engine.start()
        if tier:
            digest = kv_tier_digest(engine_fingerprint(engines[0]))
            fake = FakeBackend()
            for i, engine in enumerate(engines):
                store = await open_kv_tier(url, digest, BLOCK_SIZE) if url else KVTier(fake, digest, BLOCK_SIZE)
                wires[i] = TierWire(engine, store, fetch_choice(fetch, pool_block_bytes(engine.kv_pool), BLOCK_SIZE))
        yield engines, wires
    finally:
        for wire in wires:
            if wire is not None:
                await wire.close()
        for engine in engines:
            await engine.close()


@dataclass
class Served:
    """One request's outcome: TTFT from before the tier's fetch, its tokens, its prompt tokens
    found in a cache (`cached`, the tier's included) and fetched from the tier (`fetched`)."""

    ttft_ms: float
    tokens: list[int]
    cached: int
    fetched: int


async def serve_one(engine: Engine, wire: TierWire | None, prompt: list[int], params: SamplingParams) -> Served:
    """`prompt` served by `engine`, the tier's fetch first when `wire` is given."""
    start = time.perf_counter()
    fetched = await wire.prefetch(prompt) if wire is not None else 0
    ttft, tokens, cached = None, [], 0
    async for out in engine.generate(prompt, params):
        ttft = ttft if ttft is not None else time.perf_counter() - start
        tokens += out.token_ids
        cached = out.num_cached_tokens
    return Served((ttft or 0.0) * 1000, tokens, cached, fetched)
