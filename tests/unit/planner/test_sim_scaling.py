"""The simulator's cluster growing and shrinking during a run: an added instance serves only
after its start-up delay, a removed one finishes what it holds, and the instance-seconds
held integrate exactly on cases small enough to work out by hand."""

from __future__ import annotations

import pytest
from planner_helpers import profile

from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.sim_result import RoleChange, held_seconds
from minipd.ops.planner.sim_scaling import SimScaling
from minipd.ops.planner.simulator import Simulator
from minipd.ops.workload import RequestSpec
from minipd.policy.local_prefill import LocalPrefillThresholds
from minipd.policy.pool_scaling import PoolBounds, ScaleAction, ScalingConfig
from minipd.policy.ratio_controller import CAUSE_TTFT, CAUSE_WITHIN_BAND, ControllerConfig, Decision, Move
from minipd.slo.targets import SLO

# one prompt per 1 s prefill step (the token budget is one prompt); decode steps of 10 ms
PROFILE = profile(prefill=(1.0, 0.0, 0.0), decode=(0.01, 0.0, 0.0), max_batched_tokens=100, num_layers=1)
OPTIONS = SimOptions(link=KVLink(), local_prefill=LocalPrefillThresholds(max_local_tokens=0), control_interval_s=1.0)
NEVER = 1e9


class WantsPrefillOnce:
    """A ratio controller that asks for one more prefill instance at its first decision."""

    config = ControllerConfig(slo=SLO.parse(["ttft:1000", "itl:100"]))
    ttft_bound_s = 1.0

    def __init__(self) -> None:
        self.asked = False

    def observe_ttft(self, *args) -> None:
        pass

    observe_tokens = observe_late = observe_ttft

    def decide(self, now, num_prefill, num_decode, in_flight=0) -> Decision:
        if self.asked:
            return Decision(now, Move.HOLD, "steady", 1.0, 1.0, CAUSE_WITHIN_BAND)
        self.asked = True
        return Decision(now, Move.TO_PREFILL, "ttft short", 0.0, 1.0, CAUSE_TTFT)


def _scaling(mode="scale", capacity=3, startup=0.0, cooldown_s=NEVER, idle_window_s=NEVER) -> SimScaling:
    bounds = PoolBounds(min_prefill=1, max_prefill=capacity, min_decode=1, max_decode=capacity)
    config = ScalingConfig(bounds=bounds, cooldown_s=cooldown_s, idle_window_s=idle_window_s)
    return SimScaling(policy=config, capacity=capacity, mode=mode, startup_delay_s=startup, idle_threshold=1.0)


def _arrivals(times, output_len=2) -> list[RequestSpec]:
    return [RequestSpec(t, 100, output_len) for t in times]


def test_an_added_instance_serves_only_after_its_startup_delay() -> None:
    # one prompt every 0.5 s on a prefill instance that does one a second: the queue grows
    specs = _arrivals([0.5 * i for i in range(12)])
    sim = Simulator(PROFILE, ClusterSpec.split(1, 1), OPTIONS)
    result = sim.run(specs, WantsPrefillOnce(), _scaling(startup=2.0))
    (event,) = result.scale_events
    assert (event.time_s, event.action, event.role) == (1.0, ScaleAction.ADD, "prefill")
    starting = [r for r in result.roles if r.num_starting]
    assert [(r.time_s, r.num_prefill) for r in starting] == [(1.0, 1)]
    assert [r.time_s for r in result.roles if r.num_prefill == 2][0] == 3.0
    first_token = result.arrival_s + result.ttft_s
    # everything arriving before t=3 queued on the first instance: one first token a second
    before = first_token[result.arrival_s < 3.0]
    assert list(before) == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    # the new instance takes the prompt arriving at 3.0 at once (it is idle and has the fewest
    # queued tokens): its first token one step later
    assert first_token[result.arrival_s == 3.0][0] == pytest.approx(4.0)
    # the same run without a start-up delay serves the prompt arriving at 1.0 on the new
    # instance, right after the decision (above it waited for the first one until 3.0)
    eager = sim.run(specs, WantsPrefillOnce(), _scaling(startup=0.0))
    eager_first = eager.arrival_s + eager.ttft_s
    assert eager_first[eager.arrival_s == 1.0][0] == pytest.approx(2.0)


def test_an_add_holds_its_slot_from_the_decision_and_the_run_integrates_it() -> None:
    specs = _arrivals([0.0, 0.0])  # first tokens at 1 and 2 s, last tokens 10 ms later
    result = Simulator(PROFILE, ClusterSpec.split(1, 1), OPTIONS).run(specs, WantsPrefillOnce(), _scaling(startup=5))
    end = float(max(result.arrival_s + result.e2e_s))
    assert end == pytest.approx(2.01)
    # two instances from 0 to the add at 1 s, three (one of them starting) from then on
    assert result.instance_seconds == pytest.approx(2 * 1.0 + 3 * (end - 1.0))
    # no room: the cluster is full (capacity 2), so nothing is added
    full = Simulator(PROFILE, ClusterSpec.split(1, 1), OPTIONS).run(specs, WantsPrefillOnce(), _scaling(capacity=2))
    assert full.scale_events == () and full.instance_seconds == pytest.approx(2 * end)


def test_a_removed_instance_finishes_its_requests_then_frees_its_slot() -> None:
    # request 0 is prefilled in [0, 1] and rides 200 decode steps on decode instance 1 (done
    # at 3.0); request 1, reserved on instance 2 at once, is prefilled in [1, 2] and rides 400
    # (done at 6.0). Reserved KV is nothing next to the capacity, so the decode pool is idle
    # from the first tick (t=1) and, a 1 s window later, loses the instance holding the
    # fewest requests (a tie: the first, which holds request 0) with request 0 in flight.
    specs = [RequestSpec(0.0, 100, 201), RequestSpec(0.0, 100, 401)]
    scaling = _scaling(cooldown_s=0.0, idle_window_s=1.0)
    result = Simulator(PROFILE, ClusterSpec.split(1, 2), OPTIONS).run(specs, None, scaling)
    (event,) = result.scale_events
    assert (event.time_s, event.action, event.role) == (2.0, ScaleAction.REMOVE, "decode")
    finish = result.arrival_s + result.e2e_s
    assert list(finish) == pytest.approx([3.0, 6.0])
    assert list(result.output_len) == [201, 401]  # every token came, none lost to the removal
    removing = [(r.time_s, r.num_decode, r.num_removing) for r in result.roles]
    assert removing[1:] == [(2.0, 1, 1), (pytest.approx(3.0), 1, 0)]  # draining until its request ends
    # three instances until request 0 ends, two until request 1 does
    assert result.instance_seconds == pytest.approx(3 * 3.0 + 2 * 3.0)


def test_held_seconds_integrates_a_history_between_any_two_times() -> None:
    roles = [RoleChange(0.0, 1, 1, 0), RoleChange(2.0, 1, 1, 0, 1), RoleChange(5.0, 2, 1, 0, 0, 1)]
    assert held_seconds(roles, 0.0, 10.0) == pytest.approx(2 * 2 + 3 * 3 + 4 * 5)
    assert held_seconds(roles, 1.0, 3.0) == pytest.approx(2 * 1 + 3 * 1)
    assert held_seconds(roles, 0.0, 10.0, extra=1) == pytest.approx(3 * 2 + 4 * 3 + 5 * 5)


def test_scaling_is_refused_on_colocated_clusters_and_over_capacity() -> None:
    with pytest.raises(ValueError, match="prefill/decode"):
        Simulator(PROFILE, ClusterSpec.colocated(2), OPTIONS).run(_arrivals([0.0]), None, _scaling())
    with pytest.raises(ValueError, match="over capacity"):
        Simulator(PROFILE, ClusterSpec.split(2, 2), OPTIONS).run(_arrivals([0.0]), None, _scaling(capacity=3))
    with pytest.raises(ValueError, match="startup_delay_s"):
        _scaling(startup=-1.0)
    with pytest.raises(ValueError, match="mode"):
        _scaling(mode="grow")


def test_switch_mode_never_adds_and_scale_mode_never_switches() -> None:
    specs = _arrivals([0.5 * i for i in range(12)])
    sim = Simulator(PROFILE, ClusterSpec.split(1, 2), OPTIONS)
    switched = sim.run(specs, WantsPrefillOnce(), _scaling(mode="switch", capacity=5))
    assert [(e.action, e.role) for e in switched.scale_events] == [(ScaleAction.SWITCH, "prefill")]
    assert len(switched.moves) == 1 and switched.roles[-1].num_prefill == 2 and switched.roles[-1].num_decode == 1
    full = sim.run(specs, WantsPrefillOnce(), _scaling(mode="scale", capacity=3))  # no room, no switch
    assert full.scale_events == () and full.moves == []
