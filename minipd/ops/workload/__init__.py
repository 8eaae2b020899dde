"""Workloads: what requests arrive when, and how long their prompts and outputs are.

Pure Python (no torch, no network), shared by the load generator in `benchmarks/` and by the
planner's simulator, so that a simulated run and a measured run can be driven by the very same
list of `RequestSpec`s.
"""

from minipd.ops.workload.arrivals import ArrivalProcess, arrival_times
from minipd.ops.workload.lengths import LengthDist
from minipd.ops.workload.request_spec import RequestSpec
from minipd.ops.workload.sharegpt import load_sharegpt
from minipd.ops.workload.workloads import WORKLOADS, WorkloadShape, make_workload

__all__ = [
    "ArrivalProcess",
    "LengthDist",
    "RequestSpec",
    "WORKLOADS",
    "WorkloadShape",
    "arrival_times",
    "load_sharegpt",
    "make_workload",
]
