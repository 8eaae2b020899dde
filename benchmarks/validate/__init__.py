"""`bench.py validate`: the planner's simulator against a real 1P:1D cluster on the same workloads
(validate_bench), with the fixed per-request latency outside the steps measured by validate_probe."""
