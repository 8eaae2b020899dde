"""The policies the router runs live and the simulator replays: conditional disaggregation
(`local_prefill`: prefill a prompt on its decode instance, or send it to prefill?) and the
P:D ratio controller (`ratio_controller`: move an instance between prefill and decode, or
not). Pure functions and state machines, no I/O and no clock of their own.

Below both the router and the planner: imports only `minipd.slo`, so a router process loads
no simulator. Part of the core (the router's local-prefill decision runs on every request);
the ratio controller and the pool-scaling rule are run live by minipd/ops/control_loop.
This file imports nothing, so that importing one policy loads only that policy.
"""
