"""The KV tier in an engine's request path (disagg/tier_wire.py), over the in-process fake store:
blocks one engine computed are fetched by another, whose greedy tokens stay those computed
without the tier; a fetch that fails (corrupted values, a store down) costs computing, never a
wrong token or a leaked block; a traced request's fetch is a child span saying what it did;
blocks predicted faster to compute than to fetch are computed, the tier not even asked."""

from __future__ import annotations

import random

import pytest
from engine_helpers import complete, greedy

from minipd.disagg.fingerprint import engine_fingerprint, kv_tier_digest
from minipd.disagg.tier_wire import TierWire
from minipd.kvtier.block_header import HEADER_BYTES
from minipd.kvtier.fake_backend import FakeBackend
from minipd.kvtier.fetch_cost import Always, FetchCost
from minipd.kvtier.tier import KVTier

BLOCK_SIZE = 16
DRAIN_S = 10.0
MAX_TOKENS = 8
ENGINE = dict(model="tiny", dtype="float32", block_size=BLOCK_SIZE, num_blocks=64, max_model_len=512)


@pytest.fixture(scope="module")
def store():
    return FakeBackend()


@pytest.fixture(scope="module")
def engines(make_engine, store):
    """Two engines of one model, each with its tier over the one store, fetching whatever it
    has (the tiny model may compute a block faster than even the fake store returns it: the
    choice is tested on its own below)."""
    pair = [make_engine(**ENGINE) for _ in range(2)]
    digest = kv_tier_digest(engine_fingerprint(pair[0]))
    assert digest == kv_tier_digest(engine_fingerprint(pair[1]))
    wires = []
    for engine in pair:
        wire = TierWire(engine, KVTier(store, digest, BLOCK_SIZE))
        wire.cost = Always(wire.block_bytes, BLOCK_SIZE)
        wires.append((engine, wire))
    return wires


@pytest.fixture(autouse=True)
def fresh(engines, store, loop_thread):
    """Every test starts with an empty store and empty local caches."""
    store.values.clear()
    store.down = False
    for engine, _ in engines:
        engine.reset_pool()
    yield
    for _, wire in engines:  # stores give their blocks back before the pools are checked
        assert loop_thread.run(wire.drain(DRAIN_S))


def prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(length)]


async def serve(engine, wire: TierWire, token_ids: list[int], span=None) -> tuple[int, list[int], int]:
    """As an instance serves a request: fetch (under `span`, the request's), then submit;
    (tokens fetched, output tokens, cached tokens), once the request's stores are through."""
    fetched = await wire.prefetch(token_ids, span)
    completion = await complete(engine, token_ids, greedy(MAX_TOKENS))
    assert await wire.drain(DRAIN_S)
    return fetched, completion.token_ids, completion.num_cached_tokens


def test_blocks_one_engine_computed_are_fetched_by_another_with_the_same_tokens(engines, loop_thread):
    (a, wire_a), (b, wire_b) = engines
    turn1 = prompt(100)
    fetched, tokens_a, cached = loop_thread.run(serve(a, wire_a, turn1))
    assert (fetched, cached) == (0, 0)
    # the prompt and the generated tail are stored: the 100 + 8 - 1 computed tokens fill 6 blocks
    assert wire_a.report().blocks_stored == 6
    turn2 = turn1 + tokens_a + prompt(30, seed=1)
    fetched, tokens_b, cached = loop_thread.run(serve(b, wire_b, turn2))
    assert fetched == 6 * BLOCK_SIZE and cached == fetched  # the engine found them as local hits
    report = wire_b.report()
    assert report.tier_hit_tokens == fetched and report.local_hit_tokens == 0
    assert report.bytes_fetched > 0 and sum(report.fetch_buckets) == 1
    _, reference, _ = loop_thread.run(serve(a, wire_a, turn2))  # a computes turn 2 from its own cache
    assert tokens_b == reference


def test_the_local_cache_comes_first(engines, loop_thread):
    (a, wire_a), _ = engines
    turn1 = prompt(70, seed=2)
    loop_thread.run(serve(a, wire_a, turn1))
    before = wire_a.report()
    fetched, _, cached = loop_thread.run(serve(a, wire_a, turn1 + [5] * 20))
    after = wire_a.report()
    assert fetched == 0 and cached == 4 * BLOCK_SIZE  # all four full blocks of turn 1 are local
    assert after.local_hit_tokens - before.local_hit_tokens == 4 * BLOCK_SIZE
    assert after.tier_hit_tokens == before.tier_hit_tokens


def test_corrupted_values_are_refused_counted_and_computed(engines, store, loop_thread):
    (a, wire_a), (b, wire_b) = engines
    turn1 = prompt(80, seed=3)
    _, expected, _ = loop_thread.run(serve(a, wire_a, turn1))
    for key, value in list(store.values.items()):  # one payload byte flipped under every valid key
        corrupted = bytearray(value)
        corrupted[HEADER_BYTES + 7] ^= 0xFF
        store.values[key] = bytes(corrupted)
    before = wire_b.report()
    fetched, tokens, cached = loop_thread.run(serve(b, wire_b, turn1))
    after = wire_b.report()
    assert (fetched, cached) == (0, 0)
    assert after.verification_failures > before.verification_failures
    assert after.fetch_fallbacks == before.fetch_fallbacks + 1
    assert tokens == expected


def test_a_store_that_is_down_costs_computing(engines, store, loop_thread):
    (a, wire_a), (b, wire_b) = engines
    turn1 = prompt(60, seed=4)
    _, expected, _ = loop_thread.run(serve(a, wire_a, turn1))
    store.down = True
    fetched, tokens, _ = loop_thread.run(serve(b, wire_b, turn1))
    assert fetched == 0 and tokens == expected


def test_a_fetch_leaves_the_blocks_no_queued_request_needs(engines, loop_thread):
    """With fewer spare blocks than the hit needs, nothing is fetched (and nothing is stuck)."""
    (a, wire_a), (b, wire_b) = engines
    turn1 = prompt(200, seed=5)
    loop_thread.run(serve(a, wire_a, turn1))
    bm = b.block_manager
    held = bm.allocate_prefix([0] * (60 * BLOCK_SIZE), 60)[0]  # 4 of 64 blocks left
    try:
        assert loop_thread.run(wire_b.prefetch(turn1)) == 0
    finally:
        b.release_blocks(held)
    assert loop_thread.run(wire_b.prefetch(turn1)) == 12 * BLOCK_SIZE


class RecordedSpan:
    """A stand-in for tracing.spans.Span: its children, attributes and how it ended."""

    def __init__(self, name: str = "minipd.prefill", attributes: dict | None = None):
        self.name, self.attributes, self.children, self.ended = name, dict(attributes or {}), [], None

    def child(self, name: str, attributes: dict | None = None) -> "RecordedSpan":
        self.children.append(RecordedSpan(name, attributes))
        return self.children[-1]

    def set(self, attributes: dict) -> None:
        self.attributes.update(attributes)

    def end(self, error: str | None = None) -> None:
        self.ended = ("error", error) if error else ("ok", None)


def test_a_traced_fetch_is_a_child_span_saying_what_it_fetched(engines, store, loop_thread):
    (a, wire_a), (b, wire_b) = engines
    turn1 = prompt(100, seed=6)
    span = RecordedSpan()
    loop_thread.run(serve(a, wire_a, turn1, span))
    (miss,) = span.children
    assert miss.name == "minipd.kv_tier.fetch" and miss.ended == ("ok", None)
    assert miss.attributes == {
        "minipd.kv_tier.local_blocks": 0,
        "minipd.kv_tier.blocks_asked": 6,
        "minipd.kv_tier.blocks_found": 0,
        "minipd.kv_tier.blocks_fetched": 0,
        "minipd.kv_tier.bytes": 0,
        "minipd.kv_tier.hit": False,
        "minipd.kv_tier.outcome": "miss",
    }
    before = wire_b.report().bytes_fetched
    span = RecordedSpan()
    fetched = loop_thread.run(wire_b.prefetch(turn1, span))
    (hit,) = span.children
    assert fetched == 6 * BLOCK_SIZE
    assert hit.attributes["minipd.kv_tier.outcome"] == "hit" and hit.attributes["minipd.kv_tier.hit"] is True
    assert hit.attributes["minipd.kv_tier.blocks_found"] == hit.attributes["minipd.kv_tier.blocks_fetched"] == 6
    assert hit.attributes["minipd.kv_tier.bytes"] == wire_b.report().bytes_fetched - before > 0
    span = RecordedSpan()  # now all local: the tier is not asked, and no span is made
    assert loop_thread.run(wire_b.prefetch(turn1, span)) == 0 and span.children == []
    b.reset_pool()
    store.down = True
    span = RecordedSpan()
    assert loop_thread.run(wire_b.prefetch(turn1, span)) == 0
    (down,) = span.children
    assert down.attributes["minipd.kv_tier.outcome"] == "error" and down.ended[0] == "error"
    assert down.attributes["minipd.kv_tier.hit"] is False


class CountingStore(FakeBackend):
    """The fake store, counting the lookups (a store's own look, `leading=False`, aside) and gets."""

    def __init__(self, values: dict):
        super().__init__()
        self.values = values  # the module's store's, shared
        self.lookups = self.gets = 0

    async def exists(self, names, leading=False):
        self.lookups += leading
        return await super().exists(names, leading)

    async def get(self, names, lengths, consume):
        self.gets += 1
        return await super().get(names, lengths, consume)


def test_blocks_predicted_faster_to_compute_are_computed_and_the_tier_not_asked(engines, store, loop_thread):
    """The fetch-or-recompute choice on both sides of its break-even, in the request path: a
    store predicted slow is not asked; one predicted fast but whose blocks are too few to pay is
    asked, not fetched from; one predicted fast enough is fetched from."""
    (a, wire_a), (b, wire_b) = engines
    turn1 = prompt(100, seed=7)  # 6 full blocks
    _, expected, _ = loop_thread.run(serve(a, wire_a, turn1))
    counting = CountingStore(store.values)
    digest = wire_b.tier.model_digest
    slow_store = FetchCost(wire_b.block_bytes, BLOCK_SIZE, fetch_latency_s=1.0, token_s=1e-3, probe_every=0)
    # a lookup is cheap, the fetch's latency pays from 3 blocks on (3 * 16 tokens * 1 ms > 40 ms)
    pays_from_3 = FetchCost(
        wire_b.block_bytes,
        BLOCK_SIZE,
        lookup_s=1e-6,
        fetch_latency_s=0.04,
        fetch_bytes_per_s=1e12,
        token_s=1e-3,
        probe_every=0,
    )
    break_even = pays_from_3.lines().break_even_blocks(wire_b.block_bytes, BLOCK_SIZE, lookup=False)
    assert break_even == pytest.approx(2.5, rel=1e-3)
    wire = TierWire(b, KVTier(counting, digest, BLOCK_SIZE), cost=slow_store)
    try:
        span = RecordedSpan()
        fetched, tokens, cached = loop_thread.run(serve(b, wire, turn1, span))
        assert (fetched, cached, counting.lookups, counting.gets) == (0, 0, 0, 0)  # not even asked
        assert tokens == expected and wire.report().fetches_declined == 1
        (declined,) = span.children
        assert declined.attributes["minipd.kv_tier.outcome"] == "declined" and declined.ended == ("ok", None)

        b.reset_pool()
        wire.cost = pays_from_3
        two_of_six = turn1[: 2 * BLOCK_SIZE] + prompt(70, seed=9)  # six worth asking for; two found: too few
        assert loop_thread.run(wire.prefetch(two_of_six)) == 0
        assert (counting.lookups, counting.gets, wire.report().fetches_declined) == (1, 0, 2)
        assert loop_thread.run(wire.prefetch(turn1)) == 6 * BLOCK_SIZE  # six pay
        assert (counting.lookups, counting.gets, wire.report().fetches_declined) == (2, 1, 2)
    finally:
        loop_thread.run(wire.close())
        b.on_finished, b.on_step = wire_b._store_finished, wire_b._observe_step  # the fixture's wire again


def test_the_engine_s_prompt_steps_and_the_fetches_price_the_choice(engines, loop_thread):
    (a, wire_a), (b, wire_b) = engines
    wire_a.cost = FetchCost(wire_a.block_bytes, BLOCK_SIZE)
    wire_b.cost = FetchCost(wire_b.block_bytes, BLOCK_SIZE, probe_every=1)  # fetches, whatever it predicts
    try:
        turn1 = prompt(100, seed=8)
        loop_thread.run(serve(a, wire_a, turn1))
        assert wire_a.cost._step.num_observed >= 1  # its prompt's step (decode steps are not prompt steps)
        assert wire_a.cost._fetch.num_observed == 0  # nothing fetched
        fetched, _, _ = loop_thread.run(serve(b, wire_b, turn1))
        assert fetched == 6 * BLOCK_SIZE and wire_b.cost._fetch.num_observed == 1
    finally:
        for _, wire in engines:
            wire.cost = Always(wire.block_bytes, BLOCK_SIZE)
