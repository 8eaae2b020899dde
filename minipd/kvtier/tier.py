"""The KV tier seam: a store of KV blocks shared by every instance, that never lies and never
stalls a request.

The contract, for every backend alike (`backend.TierBackend` is what a store implements; this
class adds the rest):

- **Misses, never exceptions.** `store`, `exists`, `fetch` and `remove` never raise for anything
  the store does (down, slow, refusing, returning garbage): a failure is a miss, counted in
  `stats()` and logged at most once per 10 s per kind. They raise ValueError only for a caller's
  mistake (a buffer that is not contiguous, a destination that is not writable).
- **Bounded.** Each call returns within `TierSettings.timeout_s` (plus the time to shut its
  fetch gate: one block's copy); `register` and `close` within `setup_timeout_s`. A store call
  that outlives its bound in a worker thread is abandoned, never waited for.
- **Verified.** A fetched value is copied into the caller's buffers only after its header and
  checksum prove it is the block asked for (`block_header`); one that fails is a miss, counted
  and logged, and removed from the store so a good copy can take its place. Nothing is written
  into the caller's buffers after `fetch` returns, even by a call that timed out.
- **Bytes in flight bounded.** Stores in flight (until the store has stopped reading their
  buffers, which for a timed-out Mooncake put is when its thread returns) hold at most
  `max_store_bytes_in_flight`; blocks past the bound are skipped and counted, never queued.

A *block* is one key and the buffers that hold its KV, in order: for a layer-major pool, its run in
each layer (`pool_buffers.block_buffers`). Keys come from `keys(token_ids)`: the tier's model
digest and block size are part of every key and of every stored header.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Awaitable, NamedTuple, Sequence, TypeVar

from minipd.kvtier.backend import ERROR, FAILED, PRESENT, SKIPPED, STORED, WRONG_LENGTH, Entry, TierBackend
from minipd.kvtier.block_header import HEADER_BYTES, encode_header
from minipd.kvtier.buffers import byte_view
from minipd.kvtier.byte_budget import ByteBudget, Reservation
from minipd.kvtier.fetch_gate import FetchGate
from minipd.kvtier.keys import BlockKey, block_keys, check_model_digest
from minipd.kvtier.log_limiter import LogLimiter
from minipd.kvtier.stats import KVTierStats, TierCounters

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class TierSettings:
    """How long a tier's calls may take, and how many bytes of stores it may have in flight."""

    timeout_s: float = 2.0  # each store, exists, fetch and remove
    setup_timeout_s: float = 30.0  # opening the tier, register and close
    max_store_bytes_in_flight: int = 256 << 20


class TierBlock(NamedTuple):
    """A block to store (its buffers are read) or to fetch (its buffers are written)."""

    key: BlockKey
    buffers: Sequence[object]  # anything `buffers.byte_view` takes


class StoreResult(NamedTuple):
    stored: int  # written now
    present: int  # already in the store: nothing sent
    skipped: int  # over the bytes-in-flight bound, or no room in the backend's staging: not tried
    failed: int  # not known to be stored: the store refused, failed or ran past the bound


class FetchResult(NamedTuple):
    fetched: list[bool]  # True: the block's buffers now hold its verified bytes

    @property
    def leading(self) -> int:
        """How many leading blocks were fetched: the prefix that can be used."""
        return _leading(self.fetched)


class KVTier:
    def __init__(
        self,
        backend: TierBackend,
        model_digest: bytes,
        block_size: int,
        settings: TierSettings = TierSettings(),
    ) -> None:
        check_model_digest(model_digest)
        self.backend = backend  # public for tools and tests that reach the store directly
        self.model_digest, self.block_size = model_digest, block_size
        self.timeout_s, self.setup_timeout_s = settings.timeout_s, settings.setup_timeout_s
        self._budget = ByteBudget(settings.max_store_bytes_in_flight)
        self._counters = TierCounters()
        self._log = LogLimiter(log)
        self._background: set[asyncio.Task] = set()
        self._closed = False

    def keys(self, token_ids: Sequence[int]) -> list[BlockKey]:
        """The keys of every full block of `token_ids`, for this tier's model and block size."""
        return block_keys(self.model_digest, token_ids, self.block_size)

    def stats(self) -> KVTierStats:
        return self._counters.snapshot()

    @property
    def store_bytes_in_flight(self) -> int:
        return self._budget.in_flight

    async def register(self, buffer: object) -> bool:
        """Register a long-lived region (the KV pool) that blocks are stored from and fetched
        into; False if the store could not (stores then copy, which is slower but as correct)."""
        view = byte_view(buffer)
        return bool(await self._bounded("register", self._register(view), self.setup_timeout_s))

    async def store(self, blocks: Sequence[TierBlock]) -> StoreResult:
        """Store the blocks whose keys have no value yet. The buffers must not change until this
        returns; if they change after a timeout, while an abandoned put still reads them, the
        stored checksum no longer matches and the first fetch refuses and removes the value."""
        payloads = [[byte_view(b) for b in block.buffers] for block in blocks]
        if self._closed or not blocks:
            return StoreResult(0, 0, len(blocks), 0)
        admitted, taken = 0, 0
        for payload in payloads:
            nbytes = HEADER_BYTES + sum(b.nbytes for b in payload)
            if not self._budget.take(nbytes):
                break  # leading blocks first: a block after a gap helps no prefix
            admitted, taken = admitted + 1, taken + nbytes
        skipped = len(blocks) - admitted
        outcomes: list[str] | None = None
        if admitted:
            store = self._store(blocks[:admitted], payloads[:admitted], self._budget.reservation(taken))
            outcomes = await self._bounded("store", store, self.timeout_s)
        outcomes = outcomes if outcomes is not None else [FAILED] * admitted
        stored = [i for i, outcome in enumerate(outcomes) if outcome == STORED]
        result = StoreResult(
            len(stored), outcomes.count(PRESENT), skipped + outcomes.count(SKIPPED), outcomes.count(FAILED)
        )
        self._counters.add(
            blocks_stored=result.stored,
            blocks_present=result.present,
            stores_skipped=result.skipped,
            stores_failed=result.failed,
            bytes_stored=sum(HEADER_BYTES + sum(b.nbytes for b in payloads[i]) for i in stored),
        )
        return result

    async def exists(self, keys: Sequence[BlockKey]) -> int:
        """How many leading keys have a value in the store (0 when it cannot say). A value found
        is not yet verified: `fetch` may still refuse it."""
        if self._closed or not keys:
            return 0
        found = await self._bounded("exists", self.backend.exists([k.name for k in keys], leading=True), self.timeout_s)
        return _leading(found) if found is not None else 0

    async def fetch(self, blocks: Sequence[TierBlock]) -> FetchResult:
        """Fetch each block into its buffers; `fetched[i]` says which now hold their block's
        verified bytes (a block not fetched may have had nothing written, or, after a timeout,
        verified bytes of its own key). Nothing is written into any buffer after this returns."""
        destinations = [[byte_view(b, writable=True) for b in block.buffers] for block in blocks]
        if self._closed or not blocks:
            return FetchResult([False] * len(blocks))
        names = [block.key.name for block in blocks]
        gate = FetchGate(self.model_digest, self.block_size, [block.key.chain for block in blocks], destinations)
        try:
            statuses = await self._bounded(
                "fetch", self.backend.get(names, gate.value_lengths, gate.consume), self.timeout_s
            )
        finally:
            gate.close()
        failures = list(gate.failures)
        if statuses is not None:
            failures += [(i, "wrong length") for i, status in enumerate(statuses) if status == WRONG_LENGTH]
            if ERROR in statuses:
                self._count_error("fetch", f"the store failed {statuses.count(ERROR)} of {len(names)} keys")
        hits = sum(gate.fetched)
        self._counters.add(
            hits=hits,
            misses=len(blocks) - hits,
            verification_failures=len(failures),
            bytes_fetched=sum(n for n, ok in zip(gate.payload_lengths, gate.fetched) if ok),
        )
        for index, reason in failures:
            self._log.warning(
                f"verification {reason}",
                f"KV tier {self.backend.name}: {names[index]} failed verification ({reason}); a miss",
            )
        if failures:
            self._in_background(self.remove([blocks[i].key for i, _ in failures]))
        return FetchResult(gate.fetched)

    async def remove(self, keys: Sequence[BlockKey]) -> int:
        """Remove the keys' values (a bad value, or a model retired); the number removed."""
        if self._closed or not keys:
            return 0
        removed = await self._bounded("remove", self.backend.remove([k.name for k in keys]), self.timeout_s)
        return removed or 0

    async def close(self) -> None:
        """Let go of the store, within `setup_timeout_s`; every call after this is a miss."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.setup_timeout_s
        for task in self._background:
            task.cancel()
        if self._background:
            await asyncio.wait(self._background, timeout=self.setup_timeout_s)
        await self._bounded("close", self.backend.close(), max(0.0, deadline - loop.time()))

    async def _register(self, view: memoryview) -> bool:
        await self.backend.register(view)
        return True

    async def _store(
        self, blocks: Sequence[TierBlock], payloads: list[list[memoryview]], reservation: Reservation
    ) -> list[str]:
        handed_over = False  # once `put` has the entries, it releases the reservation
        try:
            names = [block.key.name for block in blocks]
            # Look first: a prefix already stored costs a lookup, not a transfer of its bytes.
            present = await self.backend.exists(names, leading=False)
            todo = [i for i, there in enumerate(present) if not there]
            outcomes = [PRESENT if there else FAILED for there in present]
            if not todo:
                return outcomes
            # The checksums read every byte: in a thread, not on the event loop.
            headers = await asyncio.to_thread(
                lambda: [
                    encode_header(self.model_digest, self.block_size, blocks[i].key.chain, payloads[i]) for i in todo
                ]
            )
            handed_over = True
            put = await self.backend.put(
                [Entry(names[i], h, payloads[i]) for i, h in zip(todo, headers)], reservation.release
            )
            for i, outcome in zip(todo, put):
                outcomes[i] = outcome
            return outcomes
        finally:
            if not handed_over:
                reservation.release()

    async def _bounded(self, what: str, call: Awaitable[T], timeout_s: float) -> T | None:
        """`call`'s result, or None when it failed or ran past `timeout_s` (counted and logged)."""
        try:
            return await asyncio.wait_for(call, timeout_s)
        except asyncio.TimeoutError:
            self._counters.add(timeouts=1)
            self._log.warning(
                f"timeout {what}", f"KV tier {self.backend.name}: {what} ran past {timeout_s:g} s; a miss"
            )
        except Exception as exc:  # noqa: BLE001 - whatever the store does is a miss, never the request's error
            self._count_error(what, repr(exc))
        return None

    def _count_error(self, what: str, detail: str) -> None:
        self._counters.add(errors=1)
        self._log.warning(f"error {what}", f"KV tier {self.backend.name}: {what} failed: {detail}; a miss")

    def _in_background(self, call: Awaitable[object]) -> None:
        task = asyncio.ensure_future(call)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _leading(flags: Sequence[bool]) -> int:
    count = 0
    for flag in flags:
        if not flag:
            break
        count += 1
    return count
