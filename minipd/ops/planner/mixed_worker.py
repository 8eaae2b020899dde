"""A decode or colocated instance in the simulator: continuous batching plus chunked prefill.

Every step holds all running decodes (one token each) and, with what is left of the token
budget, chunks of the prompts waiting to be prefilled here: every prompt on a colocated
instance, the locally prefilled ones on a decode instance. That shared step is how prefill
interferes with inter-token latency. KV is reserved by the router before a request reaches
the instance (prompt + output tokens), so a running request is never preempted.

With `prefill_first` (vLLM's original scheduler, DistServe's colocated baseline) a step is
instead either whole waiting prompts, up to the budget, with every decode paused, or, when
no prompt waits, all the decodes.

Token times are not stored per request: a running request rides in every decode-carrying
step of its instance from `join_step` on, so its tokens are the end times of those steps
(`times`, indexed by decode step).
"""

from __future__ import annotations

import heapq
from collections import deque

from minipd.ops.planner.batching import chunked, whole_prompts
from minipd.ops.planner.latency_model import mixed_step_s
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.sim_request import SimRequest
from minipd.ops.planner.step_times import StepTimes

DECODE = "decode"
COLOCATED = "colocated"


class MixedWorker:
    def __init__(
        self, index: int, role: str, profile: LatencyProfile, max_batched_tokens: int, prefill_first: bool = False
    ):
        if role not in (DECODE, COLOCATED):
            raise ValueError(f"role: expected {DECODE!r} or {COLOCATED!r}, got {role!r}")
        self.index = index
        self.role = role
        self.prefill_model = profile.prefill
        self.decode_model = profile.decode
        self.max_num_seqs = profile.max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.prefill_first = prefill_first
        self.kv_capacity = profile.kv_capacity_tokens
        self.kv_used = 0  # reserved tokens
        self.peak_kv_used = 0
        self.waiting: deque[SimRequest] = deque()  # to be prefilled here, FCFS
        self.waiting_tokens = 0
        self.joins: deque[SimRequest] = deque()  # prefilled, joining at the next step start
        self.num_running = 0
        self.sum_context = 0  # tokens the running decodes attend to in the next step
        self.num_assigned = 0  # admitted here and not finished
        self.busy = False
        self.busy_s = 0.0  # time spent stepping, counted when a step starts
        self.busy_mark = 0.0  # busy_s when the simulator last measured the pool
        self.draining = False
        self.times = StepTimes()
        self._finishing: list[tuple[int, int, SimRequest]] = []  # (last step index, request index, request)
        self._chunks: list[tuple[SimRequest, int]] = []
        self._num_decodes = 0
        self._step_start = 0.0
        self._last_decode_end = 0.0

    @property
    def kv_free(self) -> int:
        return self.kv_capacity - self.kv_used

    def reserve(self, request: SimRequest) -> None:
        """Hold the request's KV (the router checked that it fits)."""
        self.kv_used += request.kv_tokens
        self.peak_kv_used = max(self.peak_kv_used, self.kv_used)
        self.num_assigned += 1
        request.decode = self

    def enqueue_prefill(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self.waiting_tokens += request.prompt_len

    def join(self, request: SimRequest) -> None:
        self.joins.append(request)

    def start_step(self, now: float) -> float | None:
        step = self.times.n
        while self.joins and self.num_running < self.max_num_seqs:
            request = self.joins.popleft()
            request.join_step = step
            heapq.heappush(self._finishing, (step + request.output_len - 2, request.index, request))
            self.num_running += 1
            self.sum_context += request.prompt_len + 1
        num_decodes = self.num_running
        if self.prefill_first and self.waiting and len(self.joins) + num_decodes < self.max_num_seqs:
            chunks, tokens, sum_qk = whole_prompts(
                self.waiting, self.max_batched_tokens, self.max_num_seqs - num_decodes - len(self.joins)
            )
            num_decodes = 0
        else:
            chunks, tokens, sum_qk = chunked(
                self.waiting, self.max_batched_tokens - num_decodes, self.max_num_seqs - num_decodes - len(self.joins)
            )
        if not chunks and not num_decodes:
            return None
        self._chunks = chunks
        self._num_decodes = num_decodes
        self._step_start = now
        return mixed_step_s(self.prefill_model, self.decode_model, tokens, sum_qk, self.sum_context, num_decodes)

    @property
    def num_decodes_in_step(self) -> int:
        return self._num_decodes

    def decode_gap_s(self, now: float) -> float:
        """Time from the previous decode step's end (or from the start of this step, after an
        idle spell) to now: the gap every decode riding in this step sees, to within one step
        for those that just joined."""
        return now - max(self._last_decode_end, self._step_start)

    def end_step(self, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Account the step that ends now; returns (requests whose prompt it finished, so
        their first token is now; requests that got their last token)."""
        finished = []
        if self._num_decodes:
            step = self.times.n
            self.times.append(now)
            self._last_decode_end = now
            self.sum_context += self._num_decodes
            while self._finishing and self._finishing[0][0] == step:
                request = heapq.heappop(self._finishing)[2]
                self.num_running -= 1
                self.sum_context -= request.kv_tokens
                finished.append(request)
        prefilled, num_tokens = [], 0
        for request, q in self._chunks:
            request.prefilled += q
            num_tokens += q
            if request.prefilled == request.prompt_len:
                prefilled.append(self.waiting.popleft())
        self.waiting_tokens -= num_tokens
        self._chunks = []
        for request in prefilled:
            if request.output_len == 1:
                finished.append(request)
            else:
                self.joins.append(request)
        return prefilled, finished

    def release(self, request: SimRequest) -> None:
        """Free a finished request's KV."""
        self.kv_used -= request.kv_tokens
        self.num_assigned -= 1

    def is_idle(self) -> bool:
        return not self.busy and self.num_assigned == 0
