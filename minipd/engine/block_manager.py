"""Torch-free KV block allocator with reference counts and prefix caching.

A block holds `block_size` consecutive tokens of one sequence, in every layer. A *full* block
whose KV has been computed can be registered under a chained hash
`h_i = hash((h_{i-1}, tokens of block i))`, so another sequence with the same prefix reuses it
instead of recomputing. Hits are verified against the stored token ids, so a hash collision
costs a recompute, never a wrong answer.

Free blocks are kept in two queues: never-cached blocks are handed out first; cached blocks
whose reference count dropped to zero stay findable by hash and are evicted least recently
freed first (LRU).

Ownership: every block id returned by `allocate`, `allocate_slots` or `reserve` carries one
reference that the caller must give back with `free` exactly once.

Changes to the prefix cache (registered, evicted, reset) are recorded in `events` when one is
set (kv_events.py), on the thread that makes them.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from typing import Iterable, NamedTuple, Sequence

from minipd.engine.kv_events import KVEventLog

ROOT_HASH = 0  # parent hash of a sequence's first block


class OutOfBlocks(RuntimeError):
    """Raised when an allocation asks for more blocks than are free; check `num_free_blocks` or
    `num_new_blocks_for` first."""


class PrefixMatch(NamedTuple):
    block_ids: list[int]  # cached blocks holding the prefix, in order
    num_tokens: int  # tokens they cover (a multiple of block_size)


class BlockUsage(NamedTuple):
    num_blocks: int
    num_free: int  # reference count zero (includes cached blocks kept for reuse)
    num_used: int  # reference count above zero
    num_cached: int  # registered under a prefix hash, used or free


def chain_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of every full block of `token_ids`."""
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be positive")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self._free_uncached: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self.events: KVEventLog | None = None  # set by whoever publishes the cache's changes

    # ---- accounting -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    def usage(self) -> BlockUsage:
        free = self.num_free_blocks
        return BlockUsage(self.num_blocks, free, self.num_blocks - free, len(self._hash_to_block))

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_freed_by(self, block_id_lists: Iterable[Sequence[int]], keep: Iterable[int] = ()) -> int:
        """Blocks that would become free if every list in `block_id_lists` gave its references
        back (`free` on each), not counting the blocks in `keep`."""
        drops = Counter(b for block_ids in block_id_lists for b in block_ids)
        kept = set(keep)
        return sum(1 for b, n in drops.items() if self._ref_counts[b] == n and b not in kept)

    # ---- prefix cache -----------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """Longest run of cached full blocks that hold a prefix of `token_ids` (no refs taken).

        At least one token is always left uncached, because the last prompt token must run
        through the model to produce logits.
        """
        if not self.enable_prefix_caching:
            return PrefixMatch([], 0)
        bs = self.block_size
        block_ids = []
        for i, h in enumerate(chain_hashes(token_ids, bs)):
            block_id = self._hash_to_block.get(h)
            if block_id is None or self._block_tokens[block_id] != tuple(token_ids[i * bs : (i + 1) * bs]):
                break
            block_ids.append(block_id)
        if block_ids and len(block_ids) * bs >= len(token_ids):
            block_ids.pop()
        return PrefixMatch(block_ids, len(block_ids) * bs)

    def register_computed(self, block_ids: Sequence[int], token_ids: Sequence[int], num_computed: int) -> None:
        """Make the full blocks among the first `num_computed` tokens findable by prefix hash.

        Call after their KV is final (computed locally or received). Idempotent.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent = None
        for i, h in enumerate(chain_hashes(token_ids[:num_computed], bs)):
            block_id, previous, parent = block_ids[i], parent, h
            if self._block_hash[block_id] is not None:
                continue
            if h in self._hash_to_block:  # same content already cached in another block
                continue
            self._block_hash[block_id] = h
            self._block_tokens[block_id] = tuple(token_ids[i * bs : (i + 1) * bs])
            self._hash_to_block[h] = block_id
            if self.events is not None:
                self.events.stored(h, previous)

    def cached_hashes(self) -> list[int]:
        """Every hash the prefix cache holds now (a snapshot for a reader of `events`)."""
        return list(self._hash_to_block)

    # ---- allocation -------------------------------------------------------------------
    def allocate(self, token_ids: Sequence[int], num_tokens: int | None = None) -> tuple[list[int], int]:
        """Blocks for the first `num_tokens` (default all) of `token_ids`, reusing cached prefix blocks.

        Returns (block ids, number of leading tokens whose KV is already there).
        """
        num_tokens = len(token_ids) if num_tokens is None else num_tokens
        match = self.match_prefix(token_ids[:num_tokens])
        num_new = self.blocks_for(num_tokens) - len(match.block_ids)
        if num_new > self.num_free_blocks - self._num_free_among(match.block_ids):
            raise OutOfBlocks(f"need {num_new} new blocks, {self.num_free_blocks} free")
        for block_id in match.block_ids:
            self._take(block_id)
        return match.block_ids + self._pop_free(num_new), match.num_tokens

    def allocate_prefix(self, token_ids: Sequence[int], num_blocks: int) -> tuple[list[int], int]:
        """Blocks for the first `num_blocks` full blocks of `token_ids`: the cached ones that hold
        a prefix (unlike `allocate`, the last block may be a hit too: nothing here runs the model),
        then new ones, uncached, for the rest. Returns (block ids, how many leading ones are
        cached hits). The caller owns one reference on each; OutOfBlocks if too few are free."""
        bs = self.block_size
        hits = []
        if self.enable_prefix_caching:
            for i, h in enumerate(chain_hashes(token_ids[: num_blocks * bs], bs)):
                block_id = self._hash_to_block.get(h)
                if block_id is None or self._block_tokens[block_id] != tuple(token_ids[i * bs : (i + 1) * bs]):
                    break
                hits.append(block_id)
        num_new = num_blocks - len(hits)
        if num_new > self.num_free_blocks - self._num_free_among(hits):
            raise OutOfBlocks(f"need {num_new} new blocks, {self.num_free_blocks} free")
        for block_id in hits:
            self._take(block_id)
        return hits + self._pop_free(num_new), len(hits)

    def hold(self, block_ids: Sequence[int]) -> None:
        """One more reference on each of `block_ids`, all of which someone holds already (a
        reader that must outlive their holder, such as a store of their bytes); given back
        with `free`."""
        if any(self._ref_counts[b] <= 0 for b in block_ids):
            raise RuntimeError("hold: only a block in use can be held")
        for block_id in block_ids:
            self._ref_counts[block_id] += 1

    def num_new_blocks_for(self, token_ids: Sequence[int]) -> int:
        """Free blocks `allocate(token_ids)` would consume (cached hits that are free count too)."""
        match = self.match_prefix(token_ids)
        return self.blocks_for(len(token_ids)) - len(match.block_ids) + self._num_free_among(match.block_ids)

    def allocate_slots(self, block_ids: list[int], num_tokens: int) -> None:
        """Grow `block_ids` in place so it covers `num_tokens` tokens."""
        needed = self.blocks_for(num_tokens) - len(block_ids)
        if needed > 0:
            block_ids.extend(self._pop_free(needed))

    def reserve(self, num_blocks: int) -> list[int]:
        """Blocks whose contents will arrive from elsewhere (a remote prefill); not cached."""
        return self._pop_free(num_blocks)

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block; the tail is freed first so prefixes live longest."""
        for block_id in reversed(block_ids):
            count = self._ref_counts[block_id]
            if count <= 0:
                raise RuntimeError(f"block {block_id} freed more often than allocated")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                if self._block_hash[block_id] is None:
                    self._free_uncached.append(block_id)
                else:
                    self._free_cached[block_id] = None

    def reset(self) -> None:
        """Forget the prefix cache and return to the state of a fresh pool (every block free,
        never-cached first, in order). Only when no block is in use (RuntimeError otherwise):
        a block someone holds cannot be forgotten."""
        num_used = self.num_blocks - self.num_free_blocks
        if num_used:
            raise RuntimeError(f"reset: {num_used} blocks are still in use")
        self._block_hash = [None] * self.num_blocks
        self._block_tokens = [None] * self.num_blocks
        self._hash_to_block.clear()
        self._free_uncached = deque(range(self.num_blocks))
        self._free_cached.clear()
        if self.events is not None:
            self.events.cleared()

    # ---- internals --------------------------------------------------------------------
    def _num_free_among(self, block_ids: Sequence[int]) -> int:
        return sum(1 for b in block_ids if self._ref_counts[b] == 0)

    def _take(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            del self._free_cached[block_id]
        self._ref_counts[block_id] += 1

    def _pop_free(self, count: int) -> list[int]:
        if count > self.num_free_blocks:
            raise OutOfBlocks(f"need {count} blocks, {self.num_free_blocks} free")
        out = []
        for _ in range(count):
            if self._free_uncached:
                block_id = self._free_uncached.popleft()
            else:
                block_id, _ = self._free_cached.popitem(last=False)
                self._evict(block_id)
            self._ref_counts[block_id] = 1
            out.append(block_id)
        return out

    def _evict(self, block_id: int) -> None:
        h = self._block_hash[block_id]
        if h is not None and self._hash_to_block.get(h) == block_id:
            del self._hash_to_block[h]
            if self.events is not None:
                self.events.removed(h)
        self._block_hash[block_id] = None
        self._block_tokens[block_id] = None
