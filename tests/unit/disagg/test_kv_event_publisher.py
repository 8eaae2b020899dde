"""An instance's KV event publisher: a subscriber gets a snapshot (clear, then every cached hash)
and then every change, without being asked again; messages stay within their caps however
much is pending; an overflowed log sends a snapshot instead; the tier's stores go as medium
"tier"; a closed channel is dropped."""

from __future__ import annotations

import asyncio

import msgspec

from minipd.control.messages import (
    KV_EVENTS_MESSAGE_HASHES,
    KV_MEDIUM_TIER,
    MAX_KV_EVENT_HASHES,
    MAX_KV_EVENTS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvents,
)
from minipd.disagg.kv_event_publisher import KVEventPublisher
from minipd.engine.block_manager import BlockManager, chain_hashes

BS = 2


class Channel:
    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.sent: list[KVEvents] = []
        self.arrived = asyncio.Event()

    def send(self, message: KVEvents) -> None:
        msgspec.msgpack.Decoder(KVEvents).decode(msgspec.msgpack.encode(message))  # within the decoder's caps
        self.sent.append(message)
        self.arrived.set()

    def events(self) -> list:
        return [e for m in self.sent for e in m.events]


def cached(bm: BlockManager, tokens: list[int]) -> list[int]:
    blocks, _ = bm.allocate(tokens)
    bm.register_computed(blocks, tokens, len(tokens))
    bm.free(blocks)
    return chain_hashes(tokens, BS)


def test_a_subscriber_gets_a_snapshot_then_each_change_on_its_own():
    async def run():
        bm = BlockManager(8, BS)
        publisher = KVEventPublisher(bm)
        early = cached(bm, [1, 2, 3, 4])
        channel = Channel()
        publisher.subscribe(channel)
        snapshot = channel.events()
        channel.sent.clear()
        channel.arrived.clear()
        later = cached(bm, [1, 2, 3, 4, 5, 6])  # one new block: the flush is scheduled, not called
        await asyncio.wait_for(channel.arrived.wait(), 10)
        return early, snapshot, later, channel.events()

    early, snapshot, later, changes = asyncio.run(run())
    assert snapshot == [AllBlocksCleared(), BlockStored(block_hashes=early, parent_block_hash=None, block_size=BS)]
    assert changes == [BlockStored(block_hashes=[later[2]], parent_block_hash=later[1], block_size=BS)]


def test_messages_stay_within_their_caps_and_an_overflow_sends_a_snapshot():
    async def run():
        bm = BlockManager(4000, BS)
        publisher = KVEventPublisher(bm)
        channel = Channel()
        publisher.subscribe(channel)
        channel.sent.clear()
        for i in range(3000):  # 3000 separate prompts: 3000 one-block events
            cached(bm, [i, i])
        publisher.flush()
        small = list(channel.sent)
        channel.sent.clear()
        publisher._log.max_pending = 10
        for i in range(3000, 3020):
            cached(bm, [i, i])
        publisher.flush()
        return small, list(channel.sent), bm.cached_hashes()

    small, overflowed, everything = asyncio.run(run())
    assert sum(len(e.block_hashes) for m in small for e in m.events) == 3000
    for message in small + overflowed:
        assert len(message.events) <= MAX_KV_EVENTS
        assert sum(len(getattr(e, "block_hashes", ())) for e in message.events) <= KV_EVENTS_MESSAGE_HASHES
        assert all(len(getattr(e, "block_hashes", ())) <= MAX_KV_EVENT_HASHES for e in message.events)
    events = [e for m in overflowed for e in m.events]
    assert events[0] == AllBlocksCleared() and [h for e in events[1:] for h in e.block_hashes] == everything


def test_tier_stores_go_as_tier_and_a_closed_channel_is_dropped():
    async def run():
        bm = BlockManager(4, BS)
        publisher = KVEventPublisher(bm)
        gone, kept = Channel(), Channel()
        publisher.subscribe(gone)
        publisher.subscribe(kept)
        gone.sent.clear()
        kept.sent.clear()
        gone.closed.set()
        publisher.tier_stored([7, 8])
        bm.reset()
        publisher.flush()
        return gone.sent, kept.events(), publisher.subscribers == {kept}

    gone, kept, dropped = asyncio.run(run())
    assert gone == [] and dropped
    stored = BlockStored(block_hashes=[7, 8], parent_block_hash=None, block_size=BS, medium=KV_MEDIUM_TIER)
    assert kept == [stored, AllBlocksCleared()]
    assert not any(isinstance(e, BlockRemoved) for e in kept)
