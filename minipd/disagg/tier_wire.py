"""The shared KV tier in an instance's request path (docs/kv-tier.md): fetch before compute,
store after.

**Fetch** (`prefetch`, before a prompt is submitted to the engine): the prompt's full blocks
past the local prefix-cache hit are looked up in the tier (`exists`: how many leading ones it
has); that many blocks are taken from the pool (the local hits with them, so none is evicted
meanwhile), the hits fetched into the new ones, and the verified leading run registered in the
local prefix cache; then every reference is given back. The engine's scheduler then finds
those blocks as local prefix-cache hits, so prefill starts after them, the reservation on a
decode instance and the layer-wise send work unchanged (a prefill instance sends cached blocks
like computed ones), and a fetch that fails, times out or fails verification leaves only
fewer hits: the rest is computed. Blocks are taken only from those no queued request needs
(`Scheduler.spare_blocks`), for at most the tier's call bound. The fetched blocks are free
cached blocks from when references are given back to when the scheduler takes them (the next
engine step): the least recently freed cached blocks go first, so only a pool under pressure
evicts them, and a request then computes them, as correct as before.

**Fetch or recompute** (kvtier/fetch_cost.py): the tier is asked only when a lookup and a
fetch of the blocks past the local hit are predicted to beat computing them, and the blocks it
has are fetched only when their fetch is; else they are computed, and the decline counted
(`fetches_declined`). The prediction is fitted online from this instance's own lookups and
fetches (seconds against bytes) and its engine's steps that ran prompt tokens (seconds against
tokens, `Engine.on_step`), from a prior; `Always` fetches whatever the tier has.

**Store** (`Engine.on_finished`): when a request finishes unaborted, its full blocks whose KV
is computed (a prefill's prompt, a decode's prompt and generated tail, so the next turn of a
conversation finds the whole history) are stored in the background. Lifetime: the store takes
its own reference on the blocks (`BlockManager.hold`) and gives it back when the tier's store
returns (within its bound), so no block is reused while its bytes are read; no copy to a
staging buffer, because the pool is host memory the tier reads directly (Mooncake from the
registered pool), and holding a few blocks for at most the bound costs less than copying every
block. A put that outlives its bound may still read a block reused since: its checksum no
longer matches and the first fetch refuses it (tier.py). Blocks already in the tier cost a
lookup; over the bytes-in-flight bound a block is skipped and counted. A store with no failed
block tells `on_stored` the prefix hashes the tier now holds (the router's prefix index).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from typing import Callable, Sequence

from minipd.control.kv_tier_report import FETCH_BUCKETS_S, KVTierReport
from minipd.disagg.fingerprint import engine_fingerprint, kv_tier_digest
from minipd.disagg.tier_fetch_span import TierFetch, end_fetch_span, fetch_span
from minipd.engine.block_manager import OutOfBlocks, chain_hashes
from minipd.engine.engine import Engine
from minipd.engine.request import Request
from minipd.kvtier.fetch_cost import FetchCost, fetch_choice
from minipd.kvtier.open_tier import open_kv_tier
from minipd.kvtier.pool_buffers import block_buffers, pool_block_bytes, pool_buffer
from minipd.kvtier.tier import KVTier, TierBlock
from minipd.tracing.spans import Span

log = logging.getLogger(__name__)


class TierWire:
    """One instance's use of `tier`. Hooks itself into `engine` (its `on_finished`); all calls on
    the engine's event loop."""

    def __init__(self, engine: Engine, tier: KVTier, cost: FetchCost | None = None):
        if not engine.config.enable_prefix_caching:
            raise ValueError("kv_tier: needs the prefix cache (fetched blocks are registered in it)")
        if engine.kv_pool.device.type != "cpu":
            raise ValueError("kv_tier: the pool must be in host memory (the tier reads and writes it in place)")
        self.engine, self.tier = engine, tier
        self.block_size = engine.config.block_size
        self.block_bytes = pool_block_bytes(engine.kv_pool)
        # fetch or recompute (fetch_cost.py); fed this instance's lookups, fetches and steps
        self.cost = cost if cost is not None else FetchCost(self.block_bytes, self.block_size)
        self._counts = dict.fromkeys(
            ("lookup_tokens", "local_hit_tokens", "tier_hit_tokens", "fetch_fallbacks", "fetches_declined"), 0
        )
        self._fetch_buckets = [0] * (len(FETCH_BUCKETS_S) + 1)
        self._fetch_seconds = 0.0
        self._stores: set[asyncio.Task] = set()
        self._num_fetches = 0  # prefetches under way (each may hold blocks of the pool)
        self._idle = asyncio.Event()  # set while no store and no fetch is under way
        self._idle.set()
        self._fetching: dict[str, bool] = {}  # request id -> aborted while its fetch ran
        # told the prefix hashes (block_manager.chain_hashes) of each store's blocks the tier now holds
        self.on_stored: Callable[[list[int]], None] | None = None
        engine.on_finished = self._store_finished
        engine.on_step = self._observe_step

    # ---- fetch ------------------------------------------------------------------------
    async def prefetch_for(self, request_id: str, token_ids: Sequence[int], span: Span | None = None) -> bool:
        """`prefetch` for a request about to be submitted; False when it was aborted meanwhile
        (`abandon`): the caller then submits nothing (the engine knew nothing to abort)."""
        self._fetching[request_id] = False
        try:
            await self.prefetch(token_ids, span)
        finally:
            aborted = self._fetching.pop(request_id)
        return not aborted

    def abandon(self, request_id: str) -> None:
        """An abort of `request_id`: if its fetch is under way, it is not submitted."""
        if request_id in self._fetching:
            self._fetching[request_id] = True

    async def prefetch(self, token_ids: Sequence[int], span: Span | None = None) -> int:
        """Fetch what the tier has of `token_ids`'s prefix past the local hit into the local
        prefix cache; the tokens fetched (0 on any failure: they are computed instead). When
        the tier is asked and `span` (the request's) is traced, a `minipd.kv_tier.fetch` child
        span covers the lookup and the fetch (tier_fetch_span.py). `drain` waits for it: it may
        hold blocks of the pool until the tier's call returns."""
        self._num_fetches += 1
        self._idle.clear()
        try:
            return await self._prefetch(token_ids, span)
        finally:
            self._num_fetches -= 1
            self._settle()

    async def _prefetch(self, token_ids: Sequence[int], span: Span | None) -> int:
        bm, bs = self.engine.block_manager, self.block_size
        usable = (len(token_ids) - 1) // bs  # the last prompt token always runs through the model
        local = len(bm.match_prefix(token_ids).block_ids)
        self._counts["lookup_tokens"] += usable * bs
        self._counts["local_hit_tokens"] += local * bs
        if local >= usable:
            return 0
        fetch = TierFetch(local, usable - local, self.tier.stats())
        child = fetch_span(span, fetch)
        try:
            leading = await self._fetch(token_ids, local, usable, fetch)
        finally:
            fetch.settle(self.tier.stats())
            if child is not None:
                end_fetch_span(child, fetch)
        self._counts["tier_hit_tokens"] += leading * bs
        return leading * bs

    async def _fetch(self, token_ids: Sequence[int], local: int, usable: int, fetch: TierFetch) -> int:
        """The blocks `local`..`usable` asked of the tier and fetched; how many leading ones were
        (`fetch` records what happened)."""
        bm, bs = self.engine.block_manager, self.block_size
        if not self.cost.worth_asking(usable - local):
            fetch.declined = True  # computing them is predicted faster than even asking
            self._counts["fetches_declined"] += 1
            return 0
        keys = self.tier.keys(token_ids[: usable * bs])
        start = time.perf_counter()
        found = fetch.found = await self.tier.exists(keys[local:])
        self.cost.observe_lookup(time.perf_counter() - start)
        if not found:
            return 0
        if not self.cost.worth_fetching(found):
            fetch.declined = True
            self._counts["fetches_declined"] += 1
            return 0
        wanted = local + found
        try:
            # the blocks allocate_prefix takes from the free ones (free cached hits included)
            taken = bm.num_new_blocks_for(token_ids[: wanted * bs + 1]) - 1
            if taken > self.engine.scheduler.spare_blocks():
                fetch.no_room = True
                return 0  # the queued requests need the room: computing is slower, never stuck
            block_ids, cached = bm.allocate_prefix(token_ids, wanted)
        except OutOfBlocks:
            fetch.no_room = True
            return 0
        try:
            start = time.perf_counter()
            pool = self.engine.kv_pool
            result = await self.tier.fetch(
                [TierBlock(keys[i], block_buffers(pool, block_ids[i])) for i in range(cached, wanted)]
            )
            self._observe_fetch(time.perf_counter() - start, (wanted - cached) * self.block_bytes)
            leading = fetch.fetched = result.leading
            fetch.bytes = leading * sum(b.nbytes for b in block_buffers(pool, block_ids[0]))
            if leading < wanted - cached:
                self._counts["fetch_fallbacks"] += 1
                fetch.fallback = True
            bm.register_computed(block_ids, token_ids, (cached + leading) * bs)
        finally:
            self.engine.release_blocks(block_ids)
        return leading

    def _observe_fetch(self, seconds: float, nbytes: int) -> None:
        self._fetch_buckets[bisect.bisect_left(FETCH_BUCKETS_S, seconds)] += 1
        self._fetch_seconds += seconds
        if nbytes > 0:
            self.cost.observe_fetch(nbytes, seconds)

    def _observe_step(self, num_tokens: int, num_prompt_tokens: int, seconds: float) -> None:
        """Engine.on_step: a step that ran prompt tokens prices computing them."""
        if num_prompt_tokens > 0:
            self.cost.observe_step(num_tokens, seconds)

    # ---- store ------------------------------------------------------------------------
    def _store_finished(self, request: Request) -> None:
        """Engine.on_finished: hold the request's computed full blocks and store them in the background."""
        num_blocks = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        if num_blocks == 0:
            return
        block_ids = list(request.block_ids[:num_blocks])
        self.engine.block_manager.hold(block_ids)
        task = asyncio.get_running_loop().create_task(
            self._store(list(request.token_ids[: num_blocks * self.block_size]), block_ids)
        )
        self._stores.add(task)
        self._idle.clear()
        task.add_done_callback(self._store_ended)

    async def _store(self, token_ids: list[int], block_ids: list[int]) -> None:
        try:
            pool = self.engine.kv_pool
            keys = self.tier.keys(token_ids)
            result = await self.tier.store([TierBlock(k, block_buffers(pool, b)) for k, b in zip(keys, block_ids)])
            if self.on_stored is not None and result.failed == 0:  # the admitted blocks lead: a prefix
                held = result.stored + result.present
                self.on_stored(chain_hashes(token_ids[: held * self.block_size], self.block_size))
        except Exception:  # the tier never raises for the store; anything else is a bug, not the request's
            log.exception("KV tier: storing %d blocks failed", len(block_ids))
        finally:
            self.engine.release_blocks(block_ids)

    def _store_ended(self, task: asyncio.Task) -> None:
        self._stores.discard(task)
        self._settle()

    def _settle(self) -> None:
        if not self._stores and self._num_fetches == 0:
            self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Wait until no store and no fetch is under way (every block they held given back, each
        within the tier's call bound); False after `timeout_s`."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop hooking the engine, let the stores under way end (each within the tier's bound),
        then close the tier."""
        if self.engine.on_finished == self._store_finished:
            self.engine.on_finished = None
        if self.engine.on_step == self._observe_step:
            self.engine.on_step = None
        await self.drain(self.tier.timeout_s + self.tier.setup_timeout_s)
        await self.tier.close()

    # ---- figures ----------------------------------------------------------------------
    def report(self) -> KVTierReport:
        s = self.tier.stats()
        return KVTierReport(
            **self._counts,
            verification_failures=s.verification_failures,
            bytes_fetched=s.bytes_fetched,
            bytes_stored=s.bytes_stored,
            blocks_stored=s.blocks_stored,
            stores_skipped=s.stores_skipped,
            stores_failed=s.stores_failed,
            timeouts=s.timeouts,
            fetch_buckets=tuple(self._fetch_buckets),
            fetch_seconds_sum=self._fetch_seconds,
        )


async def open_tier_wire(engine: Engine, url: str, fetch: str = "auto") -> TierWire:
    """Open the KV tier at `url` for this engine's model and block size, register the pool
    with it (a store that cannot register copies instead) and wire it into the request path,
    fetching as `fetch` says (`--kv-tier-fetch`: kvtier/fetch_cost.py)."""
    tier = await open_kv_tier(url, kv_tier_digest(engine_fingerprint(engine)), engine.config.block_size)
    try:
        await tier.register(pool_buffer(engine.kv_pool))
        return TierWire(engine, tier, fetch_choice(fetch, pool_block_bytes(engine.kv_pool), engine.config.block_size))
    except BaseException:
        await tier.close()
        raise
