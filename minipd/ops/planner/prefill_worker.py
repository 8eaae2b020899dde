"""A prefill instance in the simulator: an FCFS queue of prompts, batched up to a token budget.

Each step takes prompts from the head of the queue up to the token budget and
`max_num_seqs`, the last one cut to what is left of the budget (`chunked`: minipd's prefill
instances chunk prompts like any other, and stream each chunk's finished blocks). The step's
KV goes out over the instance's `KVLink`; a request whose last chunk ran in the step is
handed to its decode instance when that KV has landed.
"""

from __future__ import annotations

from collections import deque

from minipd.ops.planner.batching import chunked
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.sim_request import SimRequest

PREFILL = "prefill"


class PrefillWorker:
    role = PREFILL

    def __init__(self, index: int, profile: LatencyProfile, link: KVLink, max_batched_tokens: int):
        self.index = index
        self.model = profile.prefill
        self.kv_bytes_per_token = profile.kv_bytes_per_token
        self.max_num_seqs = profile.max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.link = link
        self.queue: deque[SimRequest] = deque()
        self.queued_tokens = 0  # prompt tokens not yet computed, over the queue
        self.busy = False
        self.busy_s = 0.0  # time spent stepping, counted when a step starts
        self.busy_mark = 0.0  # busy_s when the simulator last measured the pool
        self.draining = False
        self.link_free_at = 0.0
        self.transfers_in_flight = 0
        self._step_start = 0.0
        self._chunks: list[tuple[SimRequest, int]] = []

    def enqueue(self, request: SimRequest) -> None:
        request.prefill = self
        self.queue.append(request)
        self.queued_tokens += request.prompt_len

    def start_step(self, now: float) -> float | None:
        """Pick the step's chunks; returns its duration, or None when there is nothing to do."""
        chunks, tokens, sum_qk = chunked(self.queue, self.max_batched_tokens, self.max_num_seqs)
        if not chunks:
            return None
        self._chunks = chunks
        self._step_start = now
        return self.model.step_s(tokens, sum_qk)

    def end_step(self, now: float) -> tuple[float, list[SimRequest]]:
        """Account the step that ends now; returns when its KV has landed and the requests
        whose prefill it completed."""
        done_requests, num_tokens = [], 0
        for request, q in self._chunks:
            request.prefilled += q
            num_tokens += q
            if request.prefilled == request.prompt_len:
                done_requests.append(self.queue.popleft())  # chunks are taken from the head, in order
        self.queued_tokens -= num_tokens
        self._chunks = []
        landed = self.link.done_s(self._step_start, now, self.link_free_at, num_tokens * self.kv_bytes_per_token)
        self.link_free_at = landed
        self.transfers_in_flight += len(done_requests)
        return landed, done_requests

    def is_idle(self) -> bool:
        return not self.busy and not self.queue and self.transfers_in_flight == 0
