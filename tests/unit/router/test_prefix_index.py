"""The router's prefix index on its own and in prefill picking: stored, removed and cleared
events move an instance's longest match; the tier's entries count for an instance with the
tier only, so a prompt the tier holds whole goes straight to a decode instance with the tier;
a lost instance's entries go; caps hold; and what the router sent an instance counts
until its events say it was dropped."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from test_picking_units import BS, PROMPT, handle, registry

from minipd.control.kv_tier_report import KVTierReport
from minipd.control.messages import KV_MEDIUM_TIER, AllBlocksCleared, BlockRemoved, BlockStored, KVEvents
from minipd.control.role import Role
from minipd.router.prefill_site import decide_placement
from minipd.router.prefix_index import TIER, PrefixIndex
from minipd.router.router_config import RouterConfig


def stored(hashes, medium="local"):
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, block_size=BS, medium=medium)


HASHES = [11, 12, 13, 14, 15]


def test_stored_removed_and_cleared_move_the_longest_match():
    index = PrefixIndex()
    assert not index.known("a") and index.local_match("a", HASHES) == 0
    index.apply("a", [stored(HASHES[:4])])
    assert index.known("a") and index.local_match("a", HASHES) == 4
    index.apply("a", [BlockRemoved(block_hashes=[12])])
    assert index.local_match("a", HASHES) == 1  # a hole ends the leading run
    index.apply("a", [stored([12]), AllBlocksCleared()])
    assert index.local_match("a", HASHES) == 0 and index.known("a")
    assert index.holders(11) == set()


def test_the_tier_holds_for_every_instance_and_is_cleared_on_its_own():
    index = PrefixIndex()
    index.apply("a", [stored(HASHES[:2]), stored(HASHES, KV_MEDIUM_TIER)])
    assert index.tier_match(HASHES) == 5 and index.holders(11) == {"a", TIER} and index.holders(15) == {TIER}
    assert index.match("b", HASHES) == 5 and index.local_match("b", HASHES) == 0
    index.apply("b", [BlockRemoved(block_hashes=[13], medium=KV_MEDIUM_TIER)])
    assert index.tier_match(HASHES) == 2
    index.apply("b", [AllBlocksCleared(medium=KV_MEDIUM_TIER)])
    assert index.tier_match(HASHES) == 0 and index.local_match("a", HASHES) == 2


def test_forget_drops_an_instance_and_caps_hold():
    index = PrefixIndex(max_per_instance=3, max_tier=2)
    index.apply("a", [stored(HASHES)])
    assert index.local_match("a", HASHES) == 3 and index.num_ignored == 2
    index.apply("a", [stored([21, 22, 23], KV_MEDIUM_TIER)])
    assert index.tier_match([21]) == 0 and index.tier_match([22, 23]) == 2  # least recently stored out first
    index.forget("a")
    assert not index.known("a") and index.local_match("a", HASHES) == 0


def test_wait_until_is_bounded_and_wakes_on_a_change():
    async def run():
        index = PrefixIndex()
        timed_out = await index.wait_until(lambda: index.known("a"), 0.05)
        waiter = asyncio.create_task(index.wait_until(lambda: index.local_match("a", HASHES) == 1, 10))
        await asyncio.sleep(0)  # let the waiter block
        index.apply("a", [stored(HASHES[:1])])
        return timed_out, await waiter

    assert asyncio.run(run()) == (False, True)


def test_picking_follows_the_events_not_what_was_routed():
    a, b = handle("p-a", Role.PREFILL), handle("p-b", Role.PREFILL)
    r = registry(a, b)
    hashes = r.prompt_hashes(PROMPT)
    a.remember_prefix(hashes, capacity=100)  # the router sent the whole prompt to a...
    r.kv_events(b, [stored(hashes[:2])])
    assert r.pick_prefill(hashes).instance is a  # ...and a has not published: the guess stands
    r.kv_events(a, [stored(hashes[:4]), BlockRemoved(block_hashes=hashes[:1])])  # ...but a evicted its first block
    choice = r.pick_prefill(hashes)
    assert choice.instance is b and choice.num_cached_tokens == 2 * BS


def test_a_prompt_routed_but_not_yet_published_still_draws_its_followers():
    a, b = handle("p-a", Role.PREFILL), handle("p-b", Role.PREFILL)
    r = registry(a, b)
    hashes = r.prompt_hashes(PROMPT)
    r.kv_events(a, [AllBlocksCleared()])  # both published: empty caches
    r.kv_events(b, [stored(hashes[:1])])
    a.remember_prefix(hashes, capacity=100)  # the router just sent the prompt to a
    assert r.pick_prefill(hashes).instance is a
    r.kv_events(a, [AllBlocksCleared()])  # a's pool was reset
    assert r.pick_prefill(hashes).instance is b


def test_the_tier_counts_only_for_an_instance_with_the_tier():
    a, b = handle("p-a", Role.PREFILL), handle("p-b", Role.PREFILL)
    r = registry(a, b)
    hashes = r.prompt_hashes(PROMPT)
    r.kv_events(a, [stored(hashes[:1])])
    r.kv_events(b, [stored(hashes, KV_MEDIUM_TIER)])
    assert r.overlap(b, hashes) == 0 and r.pick_prefill(hashes).instance is a  # b has no tier
    b.stats = msgspec.structs.replace(b.stats, kv_tier=KVTierReport())
    choice = r.pick_prefill(hashes)
    assert choice.instance is b and choice.num_cached_tokens == len(hashes) * BS


def test_a_prompt_the_tier_holds_whole_goes_straight_to_a_decode_instance_with_the_tier():
    decode, prefill = handle("d", Role.DECODE), handle("p", Role.PREFILL)
    r = registry(decode, prefill)
    prompt = PROMPT + [7]  # five full blocks and one token: the last token always runs
    hashes = r.prompt_hashes(prompt)
    r.kv_events(prefill, [stored(hashes, KV_MEDIUM_TIER)])

    def placement():
        uncached = len(prompt) - r.overlap(decode, hashes) * BS
        return decide_placement(decode, [prefill], len(prompt), uncached, 8, BS, RouterConfig().local_prefill)

    assert not placement().is_local  # without the tier, decode would compute all of it
    decode.stats = msgspec.structs.replace(decode.stats, kv_tier=KVTierReport())
    assert placement().is_local  # it fetches the prompt from the tier, and prefills one token


def test_a_lost_instance_leaves_the_index_and_its_late_events_are_ignored():
    a = handle("p-a", Role.PREFILL)
    r = registry(a)
    r.kv_events(a, [stored(HASHES)])
    r.lose(a, "gone", fenced=True)
    r.kv_events(a, [stored(HASHES)])
    assert not r.prefix_index.known("p-a")


def test_a_message_within_its_caps_decodes():
    ok = KVEvents(events=[stored(range(256))] * 64)
    assert msgspec.msgpack.Decoder(KVEvents).decode(msgspec.msgpack.encode(ok)) == ok


@pytest.mark.parametrize(
    "events",
    [[msgspec.to_builtins(stored(range(257)))], [{"kind": "all_blocks_cleared"}] * 65],
    ids=["an-event-over-its-hashes", "over-the-events"],
)
def test_a_message_over_its_caps_is_refused_by_the_decoder(events):
    raw = msgspec.msgpack.encode({"type": "kv_events", "events": events})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(KVEvents).decode(raw)
