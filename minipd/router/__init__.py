"""The router of a disaggregated cluster: instance registry and picking, the request lifecycle
across instances, its control port, and the Python client for it.

Imports `minipd.engine` (types only), `minipd.control`; never `minipd.disagg`'s instances, the
HTTP API, the command line or an operation (minipd/ops: the controller, the pool scaler,
cluster mode and link caps act on the router from outside, through `Router.switch_role`, its
registry and `Router.latency_observer`).
"""
