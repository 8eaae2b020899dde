"""The router's global prefix index: which instances hold which blocks, and which the shared
KV tier holds, fed by the instances' `KVEvents` (disagg/kv_event_publisher.py), not guessed.

Hashes are the engine's chained block hashes (`chain_hashes`): a hash names its whole prefix,
so an instance's match for a prompt is the count of the prompt's leading hashes it holds.
`match(instance, hashes)` is the longer of the instance's own match and the tier's (an instance
with the tier fetches what the tier holds); placement (registry.py) adds what it routed there
and no event has said was dropped.

Holders: an instance id, or `TIER`. An instance's entries go with `forget` (it was lost, or
switched roles: its pool was reset) and with its AllBlocksCleared; one that never published is
not `known`. Bounded: an instance
holds at most `max_per_instance` entries (more is a misbehaving instance: the excess is
ignored, and counted); the tier's entries are kept least recently stored first out past
`max_tier` (the tier evicts silently, so its entries may be stale: a stale one costs a
computed prefix, never a wrong answer, since the instance fetches and verifies itself).
`wait_until` lets a caller (a test) wait, bounded, for the index to reach a state.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Callable, Iterable

from minipd.control.messages import KV_MEDIUM_TIER, AllBlocksCleared, BlockRemoved, BlockStored

TIER = "tier"  # the holder name of the shared KV tier
_NOTHING: set[int] = set()
DEFAULT_MAX_PER_INSTANCE = 1 << 20
DEFAULT_MAX_TIER = 1 << 20


class PrefixIndex:
    def __init__(self, max_per_instance: int = DEFAULT_MAX_PER_INSTANCE, max_tier: int = DEFAULT_MAX_TIER):
        self.max_per_instance, self.max_tier = max_per_instance, max_tier
        self._held: dict[str, set[int]] = {}  # instance id -> hashes it holds
        self._tier: OrderedDict[int, None] = OrderedDict()
        self.num_ignored = 0  # stored hashes over an instance's cap
        self._changed = asyncio.Event()

    def known(self, instance_id: str) -> bool:
        """Whether `instance_id` has published (its entries are what it holds, not a guess)."""
        return instance_id in self._held

    def held(self, instance_id: str) -> set[int]:
        """What `instance_id` holds, as far as its events say (empty if none); not to be changed."""
        return self._held.get(instance_id, _NOTHING)

    def holders(self, block_hash: int) -> set[str]:
        """Every holder of `block_hash`: instance ids, and TIER when the tier holds it."""
        out = {i for i, held in self._held.items() if block_hash in held}
        return out | {TIER} if block_hash in self._tier else out

    def apply(self, instance_id: str, events: Iterable[BlockStored | BlockRemoved | AllBlocksCleared]) -> None:
        """Events from `instance_id`, oldest first."""
        held = self._held.setdefault(instance_id, set())
        for event in events:
            tier = event.medium == KV_MEDIUM_TIER
            match event:
                case BlockStored() if tier:
                    for h in event.block_hashes:
                        self._tier[h] = None
                        self._tier.move_to_end(h)
                    while len(self._tier) > self.max_tier:
                        self._tier.popitem(last=False)
                case BlockStored():
                    room = max(0, self.max_per_instance - len(held))
                    new = [h for h in event.block_hashes if h not in held]
                    held.update(new[:room])
                    self.num_ignored += max(0, len(new) - room)
                case BlockRemoved() if tier:
                    for h in event.block_hashes:
                        self._tier.pop(h, None)
                case BlockRemoved():
                    held.difference_update(event.block_hashes)
                case AllBlocksCleared() if tier:
                    self._tier.clear()
                case AllBlocksCleared():
                    held.clear()
        self._changed.set()

    def forget(self, instance_id: str) -> None:
        """`instance_id` is gone (or reset and not yet published again): none of its entries."""
        self._held.pop(instance_id, None)
        self._changed.set()

    def local_match(self, instance_id: str, hashes: list[int]) -> int:
        """Leading blocks of `hashes` that `instance_id` holds."""
        return _leading(self._held.get(instance_id, ()), hashes)

    def tier_match(self, hashes: list[int]) -> int:
        """Leading blocks of `hashes` that the tier holds."""
        return _leading(self._tier, hashes)

    def match(self, instance_id: str, hashes: list[int]) -> int:
        """Leading blocks `instance_id` would not compute: its own, or the tier's."""
        return max(self.local_match(instance_id, hashes), self.tier_match(hashes))

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `condition()` holds after some change (checked at once too); False after
        `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return condition()
        return True


def _leading(held, hashes: list[int]) -> int:
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n
