"""P:D ratio planning: a fitted latency model, a discrete-event simulator of P/D and colocated
clusters, the planner that searches splits for goodput under SLOs, the conditional
disaggregation policy and the ratio controller's policy. Pure: no network layers; the engine
only for profiling (`bench.py profile`). See docs/planner.md.
"""

from minipd.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.planner.kv_link import KVLink
from minipd.planner.latency_model import DecodeModel, PrefillModel, fit_decode, fit_prefill
from minipd.planner.latency_profile import LatencyProfile
from minipd.planner.local_prefill_policy import (
    LocalPrefillThresholds,
    Placement,
    PlacementInput,
    place_prefill,
)
from minipd.planner.metrics import RunSummary, summarize
from minipd.planner.planner import Plan, PlanConfig, plan
from minipd.planner.profiles import BUILTIN, builtin_profile
from minipd.planner.ratio_controller import ControllerConfig, Decision, Move, RatioController
from minipd.planner.simulator import Simulator
from minipd.planner.slo import SLO
from minipd.planner.workload_spec import WorkloadSpec

__all__ = [
    "BUILTIN",
    "SLO",
    "ClusterSpec",
    "ControllerConfig",
    "Decision",
    "DecodeModel",
    "KVLink",
    "LatencyProfile",
    "LocalPrefillThresholds",
    "Move",
    "Placement",
    "PlacementInput",
    "Plan",
    "PlanConfig",
    "PrefillModel",
    "RatioController",
    "RunSummary",
    "SimOptions",
    "Simulator",
    "WorkloadSpec",
    "builtin_profile",
    "fit_decode",
    "fit_prefill",
    "place_prefill",
    "plan",
    "summarize",
]
