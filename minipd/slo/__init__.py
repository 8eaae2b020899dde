"""One vocabulary for service-level objectives and latency, in seconds: the SLO itself
(`targets`), which requests meet it (`attainment`), latency statistics and percentiles
(`latency`, `histogram`) and goodput searches (`goodput`). The router's controller, the
simulator and planner, the load generator and bench.py all speak it; milliseconds exist only
at the edges (the `--goodput ttft:MS` flags, printed tables, the benchmarks' JSON).

The bottom layer: imports nothing of minipd. This file imports nothing either, so that
importing one module of the package loads only that module.
"""
