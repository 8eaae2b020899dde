"""An instance tells its routers what its prefix cache gained and lost (`KVEvents`), so a
router's prefix index (router/prefix_index.py) knows, not guesses, where a prefix is held.

A router subscribes (`SubscribeKVEvents`, once it has registered the instance, so that none of
them arrives before the router knows whose they are) and is sent a snapshot first
(AllBlocksCleared, then every cached hash). Batched: the block manager's changes collect in its
`KVEventLog`; the first one since the last batch schedules one flush on the event loop
(thread-safe), which sends everything pending to every subscriber, split so that no message
exceeds `MAX_KV_EVENTS` events of `MAX_KV_EVENT_HASHES` hashes, nor `KV_EVENTS_MESSAGE_HASHES`
hashes in all. After the log overflowed (changes lost), every subscriber gets a snapshot
instead. The shared KV tier's stores are published as medium "tier" (`tier_stored`).
Everything here runs on the instance's event loop; nothing waits on a router (a send is
queued on its channel), and a closed channel is dropped from the subscribers.
"""

from __future__ import annotations

import asyncio
from typing import Iterator, Sequence

from minipd.control.channel import Channel
from minipd.control.messages import (
    KV_EVENTS_MESSAGE_HASHES,
    KV_MEDIUM_LOCAL,
    KV_MEDIUM_TIER,
    MAX_KV_EVENT_HASHES,
    MAX_KV_EVENTS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvents,
)
from minipd.engine.block_manager import BlockManager
from minipd.engine.kv_events import Cleared, KVEventLog, Removed, Stored

AnyEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventPublisher:
    """Publishes `block_manager`'s changes to its subscribers (see the module docstring). Made
    on the event loop it then runs on."""

    def __init__(self, block_manager: BlockManager):
        self.block_manager = block_manager
        self.subscribers: set[Channel] = set()
        self.block_size = block_manager.block_size
        self._loop = asyncio.get_running_loop()
        self._log = KVEventLog(on_pending=self._schedule)
        block_manager.events = self._log

    def close(self) -> None:
        """Stop recording (the block manager keeps working without a log)."""
        if self.block_manager.events is self._log:
            self.block_manager.events = None

    def subscribe(self, channel: Channel) -> None:
        """Send `channel` everything cached now, after a clear, then every change."""
        self.flush()  # what is pending goes to the others; the snapshot already holds it
        self.subscribers.add(channel)
        for message in _batches(self._snapshot()):
            channel.send(message)

    def tier_stored(self, hashes: Sequence[int]) -> None:
        """Blocks the shared KV tier now holds (stored or already there), in chain order."""
        events = [
            BlockStored(
                block_hashes=list(run), parent_block_hash=None, block_size=self.block_size, medium=KV_MEDIUM_TIER
            )
            for run in _chunks(list(hashes))
        ]
        self._send(events)

    def flush(self) -> None:
        """Send what is pending to every router."""
        overflowed, events = self._log.take()
        self._send(self._snapshot() if overflowed else list(self._convert(events)))

    def _schedule(self) -> None:
        self._loop.call_soon_threadsafe(self.flush)

    def _send(self, events: list[AnyEvent]) -> None:
        self.subscribers = {c for c in self.subscribers if not c.closed.is_set()}
        for message in _batches(events):
            for channel in self.subscribers:
                channel.send(message)

    def _snapshot(self) -> list[AnyEvent]:
        hashes = self.block_manager.cached_hashes()
        stored = [
            BlockStored(block_hashes=run, parent_block_hash=None, block_size=self.block_size) for run in _chunks(hashes)
        ]
        return [AllBlocksCleared(medium=KV_MEDIUM_LOCAL), *stored]

    def _convert(self, events: list) -> Iterator[AnyEvent]:
        for event in events:
            match event:
                case Stored(hashes, parent):
                    for run in _chunks(hashes):
                        yield BlockStored(block_hashes=run, parent_block_hash=parent, block_size=self.block_size)
                        parent = run[-1]
                case Removed(hashes):
                    yield from (BlockRemoved(block_hashes=run) for run in _chunks(hashes))
                case Cleared():
                    yield AllBlocksCleared()


def _chunks(hashes: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(hashes), MAX_KV_EVENT_HASHES):
        yield hashes[start : start + MAX_KV_EVENT_HASHES]


def _batches(events: list[AnyEvent]) -> Iterator[KVEvents]:
    batch: list[AnyEvent] = []
    num_hashes = 0
    for event in events:
        size = len(getattr(event, "block_hashes", ()))
        if batch and (len(batch) == MAX_KV_EVENTS or num_hashes + size > KV_EVENTS_MESSAGE_HASHES):
            yield KVEvents(events=batch)
            batch, num_hashes = [], 0
        batch.append(event)
        num_hashes += size
    if batch:
        yield KVEvents(events=batch)
