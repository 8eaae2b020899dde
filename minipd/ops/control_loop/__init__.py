"""What steers a running cluster from its router: the live ratio controller (`live_controller`,
its latency window `controller_latency`) and its runtime switch (`controller_switch`), the pool
scaler (`pool_scaler`) and the launcher's scale link it drives (`scale_link`), cluster mode
flips (`cluster_mode`) and runtime KV link caps (`link_cap`).

Each acts through the router's public surface (`Router.switch_role`, its registry and
counters, `Router.latency_observer`); the router imports none of them. The command line
(minipd/entrypoints/roles.py) builds them around a router.
"""
