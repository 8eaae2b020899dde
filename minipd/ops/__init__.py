"""Operations: what watches or steers the serving core, never what one request needs.

- `control_loop`: the live ratio controller and its runtime switch, the pool scaler and its
  scale link, cluster mode flips, runtime KV link caps;
- `admin`: the router's admin routes and controls on its HTTP front, and their series on /metrics;
- `registry`: membership in etcd (`--registry`), role-switch claims, the controller's election;
- `dashboard`: the live dashboard and its Plan view;
- `planner`: the latency model, the P/D simulator and the planner, and their experiments;
- `loadgen`, `workload`: the load client, the router's built-in load, and the workloads.

The core (minipd/api's serving parts, router, disagg, control, engine, policy, slo, tracing,
models, transports) imports none of them: each plugs in from outside, wired by the command
line (minipd/entrypoints). See docs/architecture.md, "The two rooms"; tests/unit/test_layers.py
checks it.

This file imports nothing, so that importing one operation loads only what it needs.
"""
