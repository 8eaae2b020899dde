"""Continuous batching with a per-step token budget, chunked prefill and preemption.

Each step:
1. Running requests first, oldest first: one token for a decoding request, the next chunk
   for a request still in prefill. If a request needs a block and none is free, the newest
   preemptible running request is preempted (its blocks freed; it is recomputed later).
2. Then waiting requests, oldest first, while blocks, sequence slots and budget last. A new
   request gets blocks for its whole prompt up front, reusing prefix-cached blocks; a
   request whose prompt KV arrived from a prefill instance (adopted) already holds them.

Decode before prefill keeps inter-token latency steady in colocated mode; chunking bounds
how much prefill work one step may carry.
"""

from __future__ import annotations

import time
from collections import deque
from typing import NamedTuple

import msgspec

from minipd.engine.block_manager import BlockManager
from minipd.engine.request import Request, RequestStatus


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True):
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 1024
    enable_chunked_prefill: bool = True

    def validate(self) -> None:
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0 or self.max_model_len <= 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive and max_model_len > 1")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}) without chunked prefill, or a long prompt could never run")


class ScheduledChunk(NamedTuple):
    request: Request
    num_new_tokens: int  # tokens run this step, starting at request.num_computed_tokens
    samples: bool  # the chunk ends at the request's last known token, so one token is sampled


class SchedulerOutput(NamedTuple):
    chunks: list[ScheduledChunk]
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        config.validate()
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0  # since start, for metrics and tests

    def add(self, request: Request) -> None:
        """Queue a request. One whose prompt KV is already in `request.block_ids` (adopted from
        a prefill instance) is admitted like any other, within max_num_seqs, without
        allocating or computing its prompt again."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[Request] = []
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._chunk_size(request.num_tokens - request.num_computed_tokens, budget)
            if num_new == 0:
                i += 1
                continue
            if not self._make_room(request, num_new, preempted):
                continue  # `request` itself was preempted and left `running`: index i is the next one
            chunks.append(self._chunk(request, num_new))
            budget -= num_new
            i += 1
        if not preempted:
            budget = self._admit_waiting(budget, chunks)
        return SchedulerOutput(chunks, preempted)

    def update_computed(self, output: SchedulerOutput) -> None:
        """Advance progress after the step ran; newly full blocks become prefix-cache entries."""
        for request, num_new, _ in output.chunks:
            request.num_computed_tokens += num_new
            self.block_manager.register_computed(request.block_ids, request.token_ids,
                                                 min(request.num_computed_tokens, request.num_prompt_tokens))

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

    # ---- internals --------------------------------------------------------------------
    def _chunk_size(self, remaining: int, budget: int) -> int:
        """Tokens to run now: all that remain if they fit, else a chunk when chunking is on."""
        if remaining <= budget:
            return remaining
        return budget if self.config.enable_chunked_prefill else 0

    def _chunk(self, request: Request, num_new: int) -> ScheduledChunk:
        return ScheduledChunk(request, num_new, request.num_computed_tokens + num_new == request.num_tokens)

    def _make_room(self, request: Request, num_new: int, preempted: list[Request]) -> bool:
        bm = self.block_manager
        needed = bm.blocks_for(request.num_computed_tokens + num_new) - len(request.block_ids)
        while needed > bm.num_free_blocks:
            victim = next((r for r in reversed(self.running) if r.is_preemptible), request)
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        bm.allocate_slots(request.block_ids, request.num_computed_tokens + num_new)
        return True

    def _admit_waiting(self, budget: int, chunks: list[ScheduledChunk]) -> int:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if request.block_ids:  # prefilled elsewhere: only its new tokens run
                num_new = self._chunk_size(request.num_tokens - request.num_computed_tokens, budget)
                needed = bm.blocks_for(request.num_computed_tokens + num_new) - len(request.block_ids)
                if num_new == 0 or needed > bm.num_free_blocks:
                    break
                bm.allocate_slots(request.block_ids, request.num_computed_tokens + num_new)
                self._start(request, num_new, chunks)
                budget -= num_new
                continue
            if bm.num_new_blocks_for(request.token_ids) > bm.num_free_blocks:
                break
            match = bm.match_prefix(request.token_ids)
            num_new = self._chunk_size(request.num_tokens - match.num_tokens, budget)
            if num_new == 0:
                break
            request.block_ids, request.num_computed_tokens = bm.allocate(request.token_ids)
            if request.num_preemptions == 0:
                request.num_cached_tokens = request.num_computed_tokens
            self._start(request, num_new, chunks)
            budget -= num_new
        return budget

    def _start(self, request: Request, num_new: int, chunks: list[ScheduledChunk]) -> None:
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.monotonic()
        self.waiting.popleft()
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        chunks.append(self._chunk(request, num_new))

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._release(request)
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        self.block_manager.free(request.block_ids)
        request.block_ids = []
        request.num_computed_tokens = 0
