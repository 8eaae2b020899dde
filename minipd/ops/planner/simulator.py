"""The discrete-event simulator of a P/D (or colocated) cluster, driven by a workload.

Time jumps from event to event: an arrival, the end of an instance's step, a KV transfer
landing, an instance ready in a new role, a controller tick. The router's part, per request
(see `SimRequest` for the whole lifecycle), once `SimOptions.request_overhead_s` after it arrives:
1. admission, FCFS: reserve `prompt + output` tokens of KV on the decode (or colocated)
   instance with the most free KV; when none has room the request waits, and so does every
   later one (a full decode pool shows up as TTFT, never as over-admission);
2. placement (`place_prefill`): prefill locally on that instance, or on the prefill instance
   with the fewest queued tokens, whose KV then crosses its `KVLink`;
3. the instances' own steps do the rest (`PrefillWorker`, `MixedWorker`); a request
   prefilled on a prefill instance joins its decode instance's batch
   `SimOptions.decode_join_delay_s` after its KV has landed (its first token counts then).
With `SimOptions.prefill_jitter` / `decode_jitter` (or a measured `speed_trace`), each step's
duration is the profile's times its instance's factor at the step's start (a machine whose
speed wanders; step_jitter.py).
A `RatioController`, when given, is asked every `control_interval_s`; a move drains one
instance (no new work; it finishes what it holds), which then serves in the other role
after `switch_delay_s`. With a `SimScaling` the same tick asks the live scaler's policy
(`pool_scaling.PoolScaler`) instead whether to add an instance (serving after
`SimScaling.startup_delay_s`), drain and remove one, or switch one (sim_scaling.py); the
result's `instance_seconds` integrates the instances held.

Longer than 400 lines because: one run's event handlers share its state (the pools, the admission queue, the
instances draining, switching, starting and leaving), so they stay together in `_Run`; the
workers, the batching, the policies and the scaling set-up live in their own modules.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.latency_recorder import LatencyRecorder
from minipd.ops.planner.mixed_worker import COLOCATED, DECODE, MixedWorker
from minipd.ops.planner.prefill_worker import PREFILL, PrefillWorker
from minipd.ops.planner.sim_request import Mode, SimRequest
from minipd.ops.planner.sim_result import RoleChange, SimResult, held_seconds
from minipd.ops.planner.sim_scaling import SimScaling, pool_busy
from minipd.ops.planner.step_jitter import SpeedProcess, TracedSpeed
from minipd.ops.workload import RequestSpec
from minipd.policy.local_prefill import PlacementInput, place_prefill
from minipd.policy.pool_scaling import PoolScaler, ScaleAction, wanted

STEP_END, TRANSFER_DONE, ROLE_READY, CONTROL, TTFT_DEADLINE, DECODE_JOIN, STARTED = range(7)
DEFAULT_OPTIONS = SimOptions()


class Simulator:
    def __init__(self, profile: LatencyProfile, cluster: ClusterSpec, options: SimOptions = DEFAULT_OPTIONS):
        self.profile = profile
        self.cluster = cluster
        self.options = options
        self.link = options.link or KVLink(profile.link_gbps, profile.link_setup_s, True, profile.num_layers)
        if self.link.num_layers != profile.num_layers:
            self.link = KVLink(self.link.gbps, self.link.setup_s, self.link.layerwise, profile.num_layers)

    def run(self, specs: Sequence[RequestSpec], controller=None, scaling: SimScaling | None = None) -> SimResult:
        """Simulate `specs` (sorted by arrival) to the last token of the last request.
        `controller`: a RatioController asked every control tick; `scaling`: let the cluster
        add and remove instances (P/D clusters only; wanted roles come from `controller`)."""
        if scaling is not None:
            if self.cluster.num_colocated:
                raise ValueError("scaling: only a prefill/decode cluster scales")
            if self.cluster.size > scaling.capacity:
                raise ValueError(f"scaling: the cluster starts with {self.cluster.size} instances, over capacity")
        return _Run(self, specs, controller, scaling).execute()


class _Run:
    def __init__(self, sim: Simulator, specs: Sequence[RequestSpec], controller, scaling: SimScaling | None = None):
        self.profile, self.options, self.link, self.controller = sim.profile, sim.options, sim.link, controller
        self.scaling = scaling
        self.scaler = PoolScaler(scaling.policy) if scaling is not None else None
        self.num_starting = {PREFILL: 0, DECODE: 0}
        self.removing: list = []  # draining, then leaving the cluster
        self.budget = sim.options.max_batched_tokens or sim.profile.max_batched_tokens
        self.requests = [SimRequest(i, s.arrival_s, s.prompt_len, s.output_len) for i, s in enumerate(specs)]
        for a, b in zip(self.requests, self.requests[1:]):
            if b.arrival_s < a.arrival_s:
                raise ValueError(f"workload: request {b.index} arrives before request {a.index}; sort by arrival_s")
        for r in self.requests:
            if r.kv_tokens > self.profile.kv_capacity_tokens:
                raise ValueError(
                    f"workload: request {r.index} needs {r.kv_tokens} tokens of KV, more than an "
                    f"instance holds ({self.profile.kv_capacity_tokens})"
                )
        cluster = sim.cluster
        self.prefill = [self._new_worker(i, PREFILL) for i in range(cluster.num_prefill)]
        self.decode = [self._new_worker(cluster.num_prefill + i, DECODE) for i in range(cluster.num_decode)]
        self.colocated = [self._new_worker(i, COLOCATED) for i in range(cluster.num_colocated)]
        self.next_index = cluster.size
        self.draining: list = []
        self.num_in_transition = 0
        self.pending: deque[SimRequest] = deque()
        self.events: list = []
        self._seq = 0
        self.now = 0.0
        self.num_finished = 0
        self.num_admission_waits = 0
        self.peak_kv: dict[int, int] = {}
        prefill_jitter, decode_jitter = sim.options.prefill_jitter, sim.options.decode_jitter
        traced = TracedSpeed(sim.options.speed_trace) if sim.options.speed_trace is not None else None
        self.speed = {
            PREFILL: traced or (SpeedProcess(prefill_jitter) if prefill_jitter else None),
            DECODE: traced or (SpeedProcess(decode_jitter) if decode_jitter else None),
        }
        self.recorder = LatencyRecorder(len(self.requests))
        self.roles: list[RoleChange] = []
        self.moves: list = []
        self.scale_events: list = []

    def _new_worker(self, index: int, role: str):
        if role == PREFILL:
            return PrefillWorker(index, self.profile, self.link, self.budget)
        if role == DECODE:
            return MixedWorker(index, role, self.profile, self.budget)
        return MixedWorker(
            index,
            role,
            self.profile,
            self.options.colocated_batched_tokens or self.budget,
            prefill_first=self.options.colocated_scheduling == "prefill-first",
        )

    # ---- the event loop --------------------------------------------------------------
    def _push(self, t: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, payload))

    def execute(self) -> SimResult:
        self._record_roles()
        if self.controller is not None or self.scaling is not None:
            self._push(self.options.control_interval_s, CONTROL, None)
        requests, events, next_arrival = self.requests, self.events, 0
        overhead = self.options.request_overhead_s
        while True:
            arrival_s = requests[next_arrival].arrival_s + overhead if next_arrival < len(requests) else math.inf
            if events and events[0][0] <= arrival_s:
                self.now, _, kind, payload = heapq.heappop(events)
                self._handle(kind, payload)
            elif next_arrival < len(requests):
                self.now = arrival_s
                self._arrive(requests[next_arrival])
                next_arrival += 1
            else:
                break
        for worker in self.decode + self.colocated:
            self.peak_kv[worker.index] = max(self.peak_kv.get(worker.index, 0), worker.peak_kv_used)
        return self._result()

    def _handle(self, kind: int, payload) -> None:
        if kind == STEP_END:
            self._step_end(payload)
        elif kind == TRANSFER_DONE:
            self._transfer_done(payload)
        elif kind == ROLE_READY:
            self._role_ready(*payload)
        elif kind == CONTROL:
            self._control()
        elif kind == TTFT_DEADLINE:
            self._ttft_deadline(payload)
        elif kind == DECODE_JOIN:
            self._join(payload)
        elif kind == STARTED:
            self._started(*payload)

    def _kick(self, worker) -> None:
        if not worker.busy:
            duration = worker.start_step(self.now)
            if duration is not None:
                speed = self.speed[PREFILL if worker.role == PREFILL else DECODE]
                if speed is not None:
                    duration *= speed.factor(worker.index, self.now)
                worker.busy = True
                worker.busy_s += duration
                self._push(self.now + duration, STEP_END, worker)

    # ---- the router --------------------------------------------------------------------
    def _arrive(self, request: SimRequest) -> None:
        if self.controller is not None:
            self._push(max(self.now, request.arrival_s + self.controller.ttft_bound_s), TTFT_DEADLINE, request)
        self.pending.append(request)
        self._admit()
        if self.pending and self.pending[-1] is request:
            self.num_admission_waits += 1

    def _admit(self) -> None:
        pool = self.colocated or self.decode
        while self.pending:
            request = self.pending[0]
            best, best_free = None, request.kv_tokens - 1
            for worker in pool:
                if worker.kv_free > best_free:
                    best, best_free = worker, worker.kv_free
            if best is None:
                return
            self.pending.popleft()
            best.reserve(request)
            request.admitted_s = self.now
            self._dispatch(request, best)

    def _dispatch(self, request: SimRequest, worker: MixedWorker) -> None:
        if worker.role == COLOCATED:
            request.mode = Mode.COLOCATED
            worker.enqueue_prefill(request)
            self._kick(worker)
            return
        prefill = min(self.prefill, key=_queued_tokens) if self.prefill else None
        placement = place_prefill(
            PlacementInput(
                uncached_tokens=request.prompt_len,
                prefill_queue_tokens=prefill.queued_tokens if prefill else 0,
                prefill_queue_requests=len(prefill.queue) if prefill else 0,
                num_prefill_instances=len(self.prefill),
                decode_kv_free_tokens=worker.kv_free + request.kv_tokens,  # as it was before this reservation
                decode_kv_capacity_tokens=worker.kv_capacity,
                request_kv_tokens=request.kv_tokens,
                decode_running=worker.num_assigned - 1,
                decode_max_num_seqs=worker.max_num_seqs,
            ),
            self.options.local_prefill,
        )
        if placement.is_local:
            request.mode = Mode.LOCAL
            worker.enqueue_prefill(request)
            self._kick(worker)
        else:
            request.mode = Mode.DISAGGREGATED
            prefill.enqueue(request)
            self._kick(prefill)

    # ---- instances ---------------------------------------------------------------------
    def _step_end(self, worker) -> None:
        worker.busy = False
        if worker.role == PREFILL:
            landed, done = worker.end_step(self.now)
            for request in done:
                self._push(landed, TRANSFER_DONE, request)
        else:
            decodes, gap = worker.num_decodes_in_step, worker.decode_gap_s(self.now)
            prefilled, finished = worker.end_step(self.now)
            if decodes and self.controller is not None:
                self.controller.observe_tokens(self.now, gap, decodes)
            for request in prefilled:
                self._first_token(request)
            for request in finished:
                self._finish(request)
            if finished:
                self._admit()
        self._kick(worker)
        self._check_drained(worker)

    def _transfer_done(self, request: SimRequest) -> None:
        request.prefill.transfers_in_flight -= 1
        self._check_drained(request.prefill)
        self._first_token(request)
        if request.output_len == 1:
            self._finish(request)
            self._admit()
        elif self.options.decode_join_delay_s > 0:
            self._push(self.now + self.options.decode_join_delay_s, DECODE_JOIN, request)
        else:
            self._join(request)

    def _join(self, request: SimRequest) -> None:
        request.decode.join(request)
        self._kick(request.decode)

    def _first_token(self, request: SimRequest) -> None:
        ttft = self.recorder.first_token(request, self.now)
        if self.controller is not None and not request.reported_late:
            self.controller.observe_ttft(self.now, ttft, request.admitted_s - request.arrival_s)

    def _ttft_deadline(self, request: SimRequest) -> None:
        if request.first_token_s < 0:
            request.reported_late = True
            admitted = request.admitted_s if request.admitted_s >= 0 else self.now
            self.controller.observe_late(self.now, admitted - request.arrival_s)

    def _finish(self, request: SimRequest) -> None:
        self.recorder.finished(request, self.now)
        request.decode.release(request)
        self.num_finished += 1
        self._check_drained(request.decode)

    # ---- role changes ------------------------------------------------------------------
    def _record_roles(self) -> None:
        self.roles.append(
            RoleChange(
                self.now,
                len(self.prefill),
                len(self.decode),
                self.num_in_transition,
                sum(self.num_starting.values()),
                len(self.removing),
            )
        )

    def _control(self) -> None:
        if self.num_finished == len(self.requests):
            return
        decision = None
        if self.controller is not None:
            in_flight = self.num_in_transition + sum(self.num_starting.values())
            decision = self.controller.decide(self.now, len(self.prefill), len(self.decode), in_flight)
        if self.scaling is not None:
            self._scale(decision)
        elif decision.move.moves:
            self.moves.append(decision)
            self._drain(decision.move.source_role)
        self._push(self.now + self.options.control_interval_s, CONTROL, None)

    def _scale(self, decision) -> None:
        """The live scaler's step: observe the pools, then grow the wanted one or shrink an idle one."""
        self.scaler.observe(self.now, self._pools_busy())
        role, switch_allowed = wanted(decision) if decision is not None else (None, False)
        sizes = {PREFILL: len(self.prefill), DECODE: len(self.decode)}
        for pool, starting in self.num_starting.items():
            sizes[pool] += starting
        if role is None:
            choice = self.scaler.shrink(self.now, sizes)
        else:
            room = self.scaling.adds and self.roles[-1].num_held < self.scaling.capacity
            choice = self.scaler.grow(self.now, role, switch_allowed and self.scaling.switches, sizes, room)
        if choice.action is ScaleAction.HOLD:
            return
        self.scale_events.append(choice)
        if choice.action is ScaleAction.ADD:
            self.num_starting[choice.role] += 1
            self._push(self.now + self.scaling.startup_delay_s, STARTED, (self.next_index, choice.role))
            self.next_index += 1
            self._record_roles()
        elif choice.action is ScaleAction.REMOVE:
            self._drain(choice.role, remove=True)
        else:
            self.moves.append(decision)
            self._drain(DECODE if choice.role == PREFILL else PREFILL)

    def _pools_busy(self) -> dict[str, bool]:
        """Each pool's business over the last tick (sim_scaling.pool_busy)."""
        interval, threshold = self.options.control_interval_s, self.scaling.idle_threshold
        busy = 0.0
        for worker in self.prefill:
            busy += worker.busy_s - worker.busy_mark
            worker.busy_mark = worker.busy_s
        n = len(self.prefill)
        prefill_load = min(1.0, busy / (n * interval)) if n else 1.0
        n = len(self.decode)
        decode_load = sum(w.kv_used for w in self.decode) / (n * self.profile.kv_capacity_tokens) if n else 1.0
        return {
            PREFILL: pool_busy(prefill_load, len(self.prefill), threshold),
            DECODE: pool_busy(decode_load, len(self.decode), threshold),
        }

    def _started(self, index: int, role: str) -> None:
        self.num_starting[role] -= 1
        self._serve(index, role)
        self.scaler.done(self.now, role)

    def _drain(self, role: str, remove: bool = False) -> None:
        """Take one instance of `role` out of service; once it holds nothing it switches
        roles, or with `remove` leaves the cluster."""
        pool = self.prefill if role == PREFILL else self.decode
        worker = min(pool, key=_queued_tokens if role == PREFILL else _assigned)
        pool.remove(worker)
        worker.draining = True
        if remove:
            self.removing.append(worker)
        else:
            self.draining.append(worker)
            self.num_in_transition += 1
        self._record_roles()
        self._check_drained(worker)

    def _check_drained(self, worker) -> None:
        if not (worker.draining and worker.is_idle()):
            return
        if worker in self.draining:
            self.draining.remove(worker)
            self._push(
                self.now + self.options.switch_delay_s,
                ROLE_READY,
                (worker.index, DECODE if worker.role == PREFILL else PREFILL),
            )
        elif worker in self.removing:
            self.removing.remove(worker)
            self._record_roles()
            self.scaler.done(self.now, worker.role)
        else:
            return
        if worker.role != PREFILL:
            self.peak_kv[worker.index] = max(self.peak_kv.get(worker.index, 0), worker.peak_kv_used)

    def _role_ready(self, index: int, role: str) -> None:
        self.num_in_transition -= 1
        self._serve(index, role)

    def _serve(self, index: int, role: str) -> None:
        """A fresh instance `index` starts serving as `role`."""
        (self.prefill if role == PREFILL else self.decode).append(self._new_worker(index, role))
        self._record_roles()
        if role == DECODE:
            self._admit()

    def _result(self) -> SimResult:
        return self.recorder.result(
            self.requests,
            roles=self.roles,
            moves=self.moves,
            peak_kv_used=self.peak_kv,
            kv_capacity=self.profile.kv_capacity_tokens,
            num_admission_waits=self.num_admission_waits,
            instance_seconds=self._instance_seconds(),
            scale_events=tuple(self.scale_events),
        )

    def _instance_seconds(self) -> float:
        """The integral of the instances held from time 0 to the last token."""
        end = max((r.finish_s for r in self.requests), default=0.0)
        return held_seconds(self.roles, 0.0, end, extra=len(self.colocated))


def _queued_tokens(worker: PrefillWorker) -> int:
    return worker.queued_tokens


def _assigned(worker: MixedWorker) -> int:
    return worker.num_assigned
