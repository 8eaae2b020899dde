"""The conformance suite every KV tier store passes: the in-process fake, a real redis-server and
a real Mooncake master, each started once for the module. Each test is one promise of
`minipd.kvtier.tier.KVTier`'s docstring: bytes round-trip exactly, a prefix hit is the leading
run, a re-store sends nothing, a value that is not the block asked for (foreign bytes, a flipped
payload byte, a truncated value, another model's block) is a counted miss and is removed, keys
of another model never hit, and a store killed or black-holed costs misses within the bound,
never an exception or a hang, and works again once it is back.

Blocks are realistic: 64 of them, each 4 layer runs of 32 KiB (128 KiB a block, 8 MiB a
round trip), and each test's tokens are its own, so tests sharing a store never meet."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import time

import numpy as np
import pytest
import torch
from kvtier_stores import BLOCK_SIZE, ENVS, TIMEOUT_S, StoreEnv

from minipd.kvtier.block_header import HEADER_BYTES
from minipd.kvtier.pool_buffers import block_buffers, pool_buffer
from minipd.kvtier.tier import KVTier, TierBlock

NUM_BLOCKS, LAYERS, RUN_BYTES = 64, 4, 32 << 10
SENTINEL = 0xA5
# What a call may take past its bound: shutting its fetch gate, a busy machine's scheduling.
SLACK_S = 2.0
RECOVERY_S = 30.0  # a restarted store must serve again within this
SCENARIO_TIMEOUT_S = 200.0
MODEL = hashlib.blake2b(b"the conformance suite's model", digest_size=16).digest()
OTHER_MODEL = hashlib.blake2b(b"some other model", digest_size=16).digest()


@pytest.fixture(scope="module", params=list(ENVS))
def env(request):
    make, missing = ENVS[request.param]
    reason = missing()
    if reason:
        pytest.skip(reason)
    store = make()
    try:
        yield store
    finally:
        store.close()


def tokens(seed: int, num_blocks: int = NUM_BLOCKS) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50_000, num_blocks * BLOCK_SIZE).tolist()


class Blocks:
    """`n` blocks of seeded bytes, a destination full of SENTINEL, and the tier blocks over them."""

    def __init__(self, tier: KVTier, seed: int, n: int = NUM_BLOCKS) -> None:
        self.keys = tier.keys(tokens(seed, n))
        self.source = np.random.default_rng(seed).integers(0, 256, (n, LAYERS, RUN_BYTES), dtype=np.uint8)
        self.dest = np.full_like(self.source, SENTINEL)

    def to_store(self, start: int = 0, stop: int | None = None) -> list[TierBlock]:
        return [TierBlock(self.keys[i], list(self.source[i])) for i in range(start, stop or len(self.keys))]

    def to_fetch(self) -> list[TierBlock]:
        return [TierBlock(key, list(self.dest[i])) for i, key in enumerate(self.keys)]

    def landed(self, i: int) -> bool:
        return bool(np.array_equal(self.dest[i], self.source[i]))

    def untouched(self, i: int) -> bool:
        return bool((self.dest[i] == SENTINEL).all())


def on_a_tier(scenario):
    """The test: `scenario(env, tier, **params)` on a tier of MODEL opened on the store, closed
    after it. Its signature is the scenario's less `tier`, which pytest would look for as a fixture."""

    def test(env: StoreEnv, **params) -> None:
        async def main():
            tier = await env.open(MODEL)
            try:
                await scenario(env, tier, **params)
            finally:
                await tier.close()

        asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT_S))

    signature = inspect.signature(scenario)
    test.__signature__ = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "tier"])
    test.__name__, test.__doc__ = scenario.__name__, scenario.__doc__
    return test


@contextlib.contextmanager
def tier_warnings():
    """The tier's warnings logged inside the block, as text."""
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("minipd.kvtier.tier")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


async def timed(call):
    start = time.monotonic()
    result = await call
    return result, time.monotonic() - start


async def until_it_serves(tier: KVTier, seed: int) -> None:
    """Poll a one-block store and fetch until it round-trips; AssertionError after RECOVERY_S."""
    deadline = time.monotonic() + RECOVERY_S
    probe = Blocks(tier, seed, n=1)
    while True:
        await tier.store(probe.to_store())
        if (await tier.fetch(probe.to_fetch())).fetched == [True] and probe.landed(0):
            return
        assert time.monotonic() < deadline, f"the store did not serve again within {RECOVERY_S} s"
        await asyncio.sleep(0.2)  # polling a restarted store, bounded by the deadline


@pytest.mark.timeout(180)
@on_a_tier
async def test_blocks_round_trip_bytes_exact(env: StoreEnv, tier: KVTier):
    blocks = Blocks(tier, seed=1)
    stored = await tier.store(blocks.to_store())
    assert (stored.stored, stored.present, stored.skipped, stored.failed) == (NUM_BLOCKS, 0, 0, 0)
    assert await tier.exists(blocks.keys) == NUM_BLOCKS
    fetched = await tier.fetch(blocks.to_fetch())
    assert fetched.leading == NUM_BLOCKS and np.array_equal(blocks.dest, blocks.source)
    stats = tier.stats()
    assert (stats.hits, stats.misses, stats.verification_failures) == (NUM_BLOCKS, 0, 0)
    assert stats.bytes_fetched == NUM_BLOCKS * LAYERS * RUN_BYTES
    assert stats.bytes_stored == NUM_BLOCKS * (HEADER_BYTES + LAYERS * RUN_BYTES)
    assert tier.store_bytes_in_flight == 0


@pytest.mark.timeout(180)
@on_a_tier
async def test_a_partial_hit_is_the_leading_run(env: StoreEnv, tier: KVTier):
    blocks = Blocks(tier, seed=2)
    assert (await tier.store(blocks.to_store(0, 40))).stored == 40
    assert await tier.exists(blocks.keys) == 40
    fetched = await tier.fetch(blocks.to_fetch())
    assert fetched.leading == 40 and not any(fetched.fetched[40:])
    assert all(blocks.landed(i) for i in range(40)) and all(blocks.untouched(i) for i in range(40, NUM_BLOCKS))
    assert (tier.stats().hits, tier.stats().misses) == (40, NUM_BLOCKS - 40)


@pytest.mark.timeout(180)
@on_a_tier
async def test_storing_again_sends_nothing(env: StoreEnv, tier: KVTier):
    blocks = Blocks(tier, seed=3, n=16)
    assert (await tier.store(blocks.to_store())).stored == 16
    before = await env.raw_get(tier, blocks.keys[5].name)
    bytes_stored = tier.stats().bytes_stored
    again = await tier.store(blocks.to_store())
    assert (again.stored, again.present) == (0, 16)
    assert tier.stats().bytes_stored == bytes_stored and tier.stats().blocks_present == 16
    assert await env.raw_get(tier, blocks.keys[5].name) == before


@pytest.mark.timeout(180)
@on_a_tier
async def test_a_value_that_is_not_the_block_is_a_counted_miss_and_is_removed(env: StoreEnv, tier: KVTier):
    """Each corruption under a valid key: foreign bytes, a flipped payload byte, a truncated
    value, the block of another model, and the header of another block."""

    blocks = Blocks(tier, seed=4, n=8)
    assert (await tier.store(blocks.to_store())).stored == 8
    good = [await env.raw_get(tier, key.name) for key in blocks.keys]
    assert all(len(v) == HEADER_BYTES + LAYERS * RUN_BYTES for v in good)
    other = await env.open(OTHER_MODEL)
    try:
        assert (await other.store([TierBlock(other.keys(tokens(4, 8))[3], list(blocks.source[3]))])).stored == 1
        other_models_value = await env.raw_get(other, other.keys(tokens(4, 8))[3].name)
    finally:
        await other.close()
    flipped = bytearray(good[2])
    flipped[HEADER_BYTES + 1000] ^= 0x01
    corrupt = {
        1: np.random.default_rng(41).bytes(len(good[1])),  # foreign bytes of the value's length
        2: bytes(flipped),
        3: other_models_value,
        4: good[4][: len(good[4]) // 2],
        5: good[7],  # the whole, valid value of another block
        6: b"not a block at all" * 100,  # short foreign bytes
    }
    for i, value in corrupt.items():
        await env.raw_put(tier, blocks.keys[i].name, value)
    with tier_warnings() as warnings:
        fetched = await tier.fetch(blocks.to_fetch())
    assert fetched.fetched == [i not in corrupt for i in range(8)]
    assert all(blocks.untouched(i) for i in corrupt) and all(blocks.landed(i) for i in (0, 7))
    assert tier.stats().verification_failures == len(corrupt) and tier.stats().misses == len(corrupt)
    logged = "\n".join(warnings)
    for reason in ("not a minipd block", "checksum", "another model", "another block"):
        assert f"failed verification ({reason})" in logged
    # A value of another length: Mooncake must be told a value's length to read it, so it says
    # so before any byte is read; the others read it and find it short.
    assert "failed verification (truncated)" in logged or "failed verification (wrong length)" in logged
    # Removed, so a good copy can take their place.
    deadline = time.monotonic() + 10.0
    while any([await env.raw_get(tier, blocks.keys[i].name) for i in corrupt]):
        assert time.monotonic() < deadline, "the values that failed verification were not removed"
        await asyncio.sleep(0.05)  # polling the store for the tier's background removal
    assert (await tier.store(blocks.to_store())).stored == len(corrupt)
    assert (await tier.fetch(blocks.to_fetch())).leading == 8 and np.array_equal(blocks.dest, blocks.source)


@pytest.mark.timeout(180)
@on_a_tier
async def test_another_models_keys_never_hit(env: StoreEnv, tier: KVTier):
    blocks = Blocks(tier, seed=5, n=16)
    assert (await tier.store(blocks.to_store())).stored == 16
    other = await env.open(OTHER_MODEL)
    try:
        theirs = other.keys(tokens(5, 16))
        assert not {k.name for k in theirs} & {k.name for k in blocks.keys}
        assert await other.exists(theirs) == 0
        dest = np.full_like(blocks.source, SENTINEL)
        fetched = await other.fetch([TierBlock(key, list(dest[i])) for i, key in enumerate(theirs)])
        assert not any(fetched.fetched) and (dest == SENTINEL).all()
        assert other.stats().verification_failures == 0 and other.stats().misses == 16
    finally:
        await other.close()


@pytest.mark.timeout(180)
@on_a_tier
async def test_removed_blocks_miss(env: StoreEnv, tier: KVTier):
    blocks = Blocks(tier, seed=6, n=8)
    assert (await tier.store(blocks.to_store())).stored == 8
    assert await tier.remove(blocks.keys[2:]) == 6
    assert await tier.exists(blocks.keys) == 2
    fetched = await tier.fetch(blocks.to_fetch())
    assert fetched.fetched == [True, True] + [False] * 6


@pytest.mark.timeout(180)
@on_a_tier
async def test_a_registered_pool_round_trips(env: StoreEnv, tier: KVTier):
    """The wiring's shape: blocks stored straight from a layer-major pool (registered, so Mooncake
    sends from it without a copy) and fetched into other blocks of it."""

    pool = torch.zeros((LAYERS, 32, 2, BLOCK_SIZE, 2, 64), dtype=torch.bfloat16)
    pool[:, :8].normal_()
    assert await tier.register(pool_buffer(pool))
    keys = tier.keys(tokens(7, 8))
    stored = await tier.store([TierBlock(key, block_buffers(pool, b)) for b, key in enumerate(keys)])
    assert stored.stored == 8
    fetched = await tier.fetch([TierBlock(key, block_buffers(pool, 16 + b)) for b, key in enumerate(keys)])
    assert fetched.leading == 8 and torch.equal(pool[:, 16:24], pool[:, :8])


async def misses_within_the_bound(tier: KVTier, blocks: Blocks, fault, cure) -> None:
    """With the store under `fault` (until `cure`): store the second half of `blocks`, look them
    all up, fetch them all; each call must return its misses within the bound, touching nothing."""
    fault()
    try:
        stored, store_s = await timed(tier.store(blocks.to_store(len(blocks.keys) // 2)))
        found, exists_s = await timed(tier.exists(blocks.keys))
        fetched, fetch_s = await timed(tier.fetch(blocks.to_fetch()))
    finally:
        cure()
    assert max(store_s, exists_s, fetch_s) < TIMEOUT_S + SLACK_S, (store_s, exists_s, fetch_s)
    assert stored.stored == 0 and found == 0 and not any(fetched.fetched)
    assert all(blocks.untouched(i) for i in range(len(blocks.keys)))


# How each fault is made and cured, and whether the store keeps its blocks through it: a killed
# store loses them (none persist), a black-holed one only stalls.
FAULTS = {"killed": ("kill", "restart", False), "black-holed": ("freeze", "thaw", True)}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", list(FAULTS))
@on_a_tier
async def test_a_faulty_store_costs_misses_within_the_bound_and_serves_once_cured(env: StoreEnv, tier: KVTier, fault):
    make, cure, keeps = FAULTS[fault]
    blocks = Blocks(tier, seed=8 + list(FAULTS).index(fault), n=16)
    assert (await tier.store(blocks.to_store(0, 8))).stored == 8
    await misses_within_the_bound(tier, blocks, getattr(env, make), getattr(env, cure))
    stats = tier.stats()
    assert stats.errors + stats.timeouts >= 3 and (keeps is False or stats.timeouts == 3)
    await until_it_serves(tier, seed=20)
    # The second half's store was abandoned, not undone: once cured it may land yet, whole or not
    # at all, so past the first half whatever is fetched must be exact too.
    fetched = await tier.fetch(blocks.to_fetch())
    assert fetched.leading >= 8 if keeps else fetched.leading == 0
    assert all(blocks.landed(i) for i, ok in enumerate(fetched.fetched) if ok)
