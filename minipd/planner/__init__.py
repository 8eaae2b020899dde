"""P:D ratio planning: a fitted latency model, a discrete-event simulator of P/D and colocated
clusters, the planner that searches splits for goodput under SLOs, the conditional
disaggregation policy and the ratio controller's policy. Pure: no network layers; the engine
only for profiling (`bench.py profile`). See docs/planner.md.
"""

from .cluster_spec import ClusterSpec, SimOptions
from .kv_link import KVLink
from .latency_model import DecodeModel, PrefillModel, fit_decode, fit_prefill
from .latency_profile import LatencyProfile
from .local_prefill_policy import (
    LocalPrefillThresholds,
    Placement,
    PlacementInput,
    place_prefill,
)
from .metrics import RunSummary, summarize
from .planner import Plan, PlanConfig, plan
from .profiles import BUILTIN, builtin_profile
from .ratio_controller import ControllerConfig, Decision, Move, RatioController
from .simulator import Simulator
from .slo import SLO
from .workload_spec import WorkloadSpec

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
