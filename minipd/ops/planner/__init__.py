"""P:D ratio planning: a fitted latency model (`latency_model`, `latency_profile`,
`profiles`), a discrete-event simulator of P/D and colocated clusters (`simulator` and its
workers), and the planner that searches splits for goodput under SLOs (`planner`). Pure: no
network layers; the engine only for profiling (`bench.py profile`). The policies the
simulator replays live in `minipd.policy`, the SLO vocabulary in `minipd.slo`; the command
line (`minipd plan|day|calibrate-distserve`) and the experiments behind it in `experiments/`.
See docs/planner.md.

This file imports nothing, so that importing one module of the package loads only what that
module needs.
"""
