"""Continuous batching with a per-step token budget, chunked prefill, and age-ordered preemption.

Every request gets an age rank when it is first queued (`Request.order`, lower is older) and
keeps it through preemption. One rule keeps the KV pool from deadlocking: **an older request
may take blocks from any newer one, never the reverse.** Each step:
1. Running requests, oldest first: one token for a decoding request, the next chunk for one
   still in prefill. A request that needs a block when none is free takes blocks from newer
   requests that hold some, newest first: running ones, and waiting ones whose prompt KV
   arrived from a prefill instance (adopted). Each such victim is preempted: its blocks are
   freed and it is recomputed later. When the newer requests together cannot free enough, it
   sits this step out and keeps its blocks (an older request may still take them).
2. Then, unless step 1 preempted, waiting requests oldest first (a request never overtakes an
   older one), while blocks, sequence slots and budget last. A new request gets blocks for its
   whole prompt up front, reusing prefix-cached blocks; an adopted one already holds them. The
   oldest waiting request may take blocks from newer waiting requests that hold some.

Why this cannot deadlock: the oldest request can always get every block it needs from newer
requests, except blocks held outside the scheduler, and those are all on their way back:
reservations whose KV is arriving (adopted as the newest request, or freed, within their
lease) and blocks whose KV streams out (freed once sent). A reservation takes only blocks that
no queued request needs next (`spare_blocks`), so it cannot starve them either.

Decode before prefill keeps inter-token latency steady in colocated mode; chunking bounds
how much prefill work one step may carry.
"""

from __future__ import annotations

import bisect
import itertools
import time
from typing import Callable, NamedTuple, Sequence

import msgspec

from minipd.engine.block_manager import BlockManager
from minipd.engine.request import Request, RequestStatus


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The batching limits: the one definition of these fields (an `EngineConfig` holds one).
    `validate` names the first bad field in its ValueError."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 1024
    enable_chunked_prefill: bool = True

    def validate(self) -> None:
        for field in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field}: must be positive, got {getattr(self, field)}")
        if self.max_model_len <= 1:  # a prompt of one token and one output token at least
            raise ValueError(f"max_model_len: must be > 1, got {self.max_model_len}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens: ({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}) without chunked prefill, or a long prompt could never run"
            )


class ScheduledChunk(NamedTuple):
    request: Request
    num_new_tokens: int  # tokens run this step, starting at request.num_computed_tokens
    samples: bool  # the chunk ends at the request's last known token, so one token is sampled


class SchedulerOutput(NamedTuple):
    chunks: list[ScheduledChunk]
    preempted: list[Request]  # lost their blocks this step (running or adopted-and-waiting)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)


def _age(request: Request) -> int:
    return request.order


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        config.validate()
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[Request] = []  # oldest first
        self.running: list[Request] = []  # oldest first
        self.num_preemptions = 0  # since start, for metrics and tests
        self._orders = itertools.count()

    def add(self, request: Request) -> None:
        """Queue a request as the newest. One whose prompt KV is already in `request.block_ids`
        (adopted from a prefill instance) is admitted like any other, within max_num_seqs,
        without allocating or computing its prompt again."""
        request.status = RequestStatus.WAITING
        request.order = next(self._orders)
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[Request] = []
        for request in list(self.running):  # a copy: making room removes newer requests
            if budget <= 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # an older request took its blocks this step
            num_new = self._chunk_size(request.num_tokens - request.num_computed_tokens, budget)
            if num_new == 0 or not self._make_room(request, num_new, preempted, take_from_running=True):
                continue
            chunks.append(self._chunk(request, num_new))
            budget -= num_new
        if not preempted:
            self._admit_waiting(budget, chunks, preempted)
        return SchedulerOutput(chunks, preempted)

    def update_computed(self, output: SchedulerOutput) -> None:
        """Advance progress after the step ran; newly full blocks become prefix-cache entries."""
        for request, num_new, _ in output.chunks:
            request.num_computed_tokens += num_new
            self.block_manager.register_computed(
                request.block_ids, request.token_ids, min(request.num_computed_tokens, request.num_prompt_tokens)
            )

    def finish(self, request: Request, free_blocks: bool = True) -> list[int]:
        """Remove a request from the queues; its blocks are freed, or returned to the caller
        (who must free them) with `free_blocks=False`. Later calls for the request do nothing."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            return []
        request.status = RequestStatus.FINISHED
        if free_blocks:
            self._release(request)
            return []
        block_ids, request.block_ids = request.block_ids, []
        return block_ids

    def num_prefilling(self) -> int:
        """Running requests whose prompt's KV is not all computed yet; the other running ones
        decode (an adopted request arrives with its prompt's KV, so it decodes from the start)."""
        return sum(1 for r in self.running if r.num_computed_tokens < r.num_prompt_tokens)

    def num_blocks_needed(self) -> int:
        """Blocks the queued requests need for their next step beyond those they hold: the
        whole sequence of every waiting request that holds none (an upper bound: prefix-cache
        hits are not subtracted), and the next block of every request about to cross into
        one. Anything newer (a reservation) must leave these free."""
        bm = self.block_manager
        return sum(
            max(0, bm.blocks_for(r.num_tokens) - len(r.block_ids)) for r in itertools.chain(self.running, self.waiting)
        )

    def spare_blocks(self) -> int:
        """Free blocks that no queued request needs for its next step: what a reservation (the
        newest request of all) may take."""
        return self.block_manager.num_free_blocks - self.num_blocks_needed()

    # ---- internals --------------------------------------------------------------------
    def _chunk_size(self, remaining: int, budget: int) -> int:
        """Tokens to run now: all that remain if they fit, else a chunk when chunking is on."""
        if remaining <= budget:
            return remaining
        return budget if self.config.enable_chunked_prefill else 0

    def _chunk(self, request: Request, num_new: int) -> ScheduledChunk:
        return ScheduledChunk(request, num_new, request.num_computed_tokens + num_new == request.num_tokens)

    def _make_room(self, request: Request, num_new: int, preempted: list[Request], take_from_running: bool) -> bool:
        """Grow `request`'s blocks to cover `num_new` more tokens, taking blocks from newer
        requests if needed; False (nothing changed for `request`) when that cannot be done."""
        bm = self.block_manager

        def shortfall() -> int:
            return bm.blocks_for(request.num_computed_tokens + num_new) - len(request.block_ids) - bm.num_free_blocks

        if not self._reclaim(request, shortfall, preempted, take_from_running):
            return False
        bm.allocate_slots(request.block_ids, request.num_computed_tokens + num_new)
        return True

    def _reclaim(
        self,
        request: Request,
        shortfall: Callable[[], int],
        preempted: list[Request],
        take_from_running: bool,
        keep: Sequence[int] = (),
    ) -> bool:
        """Preempt requests newer than `request`, newest first, until `shortfall()` <= 0; only
        if together they can free enough (their KV is not thrown away for nothing). `keep`:
        blocks `request` would reuse (its prefix-cache hits), which freeing does not gain."""
        if shortfall() <= 0:
            return True
        holders = [r for r in self.waiting if r.block_ids]
        if take_from_running:
            holders += self.running
        victims = sorted((r for r in holders if r.order > request.order and r.is_preemptible), key=_age, reverse=True)
        if self.block_manager.num_freed_by((v.block_ids for v in victims), keep) < shortfall():
            return False
        for victim in victims:
            if shortfall() <= 0:
                break
            self._preempt(victim)
            preempted.append(victim)
        return shortfall() <= 0

    def _admit_waiting(self, budget: int, chunks: list[ScheduledChunk], preempted: list[Request]) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if request.block_ids:  # prefilled elsewhere: only its new tokens run
                num_new = self._chunk_size(request.num_tokens - request.num_computed_tokens, budget)
                if num_new == 0 or not self._make_room(request, num_new, preempted, take_from_running=False):
                    break
                self._start(request, num_new, chunks)
                budget -= num_new
                continue
            match = bm.match_prefix(request.token_ids)
            num_new = self._chunk_size(request.num_tokens - match.num_tokens, budget)
            if num_new == 0:
                break

            def shortfall(request: Request = request) -> int:
                return bm.num_new_blocks_for(request.token_ids) - bm.num_free_blocks

            if not self._reclaim(request, shortfall, preempted, take_from_running=False, keep=match.block_ids):
                break
            request.block_ids, request.num_computed_tokens = bm.allocate(request.token_ids)
            if request.num_preemptions == 0:
                request.num_cached_tokens = request.num_computed_tokens
            self._start(request, num_new, chunks)
            budget -= num_new

    def _start(self, request: Request, num_new: int, chunks: list[ScheduledChunk]) -> None:
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.monotonic()
        self.waiting.pop(0)
        request.status = RequestStatus.RUNNING
        bisect.insort(self.running, request, key=_age)
        chunks.append(self._chunk(request, num_new))

    def _preempt(self, request: Request) -> None:
        """Free the request's blocks; it waits (in age order) to be recomputed."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            request.status = RequestStatus.WAITING
            bisect.insort(self.waiting, request, key=_age)
        self._release(request)
        request.num_preemptions += 1
        self.num_preemptions += 1

    def _release(self, request: Request) -> None:
        self.block_manager.free(request.block_ids)
        request.block_ids = []
        request.num_computed_tokens = 0
