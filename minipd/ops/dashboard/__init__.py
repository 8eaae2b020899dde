"""The live dashboard: `GET /dashboard` on an HTTP front (the router's, or a colocated
instance's), a page of the cluster against its SLOs with its data pushed as server-sent events.

- `request_window`: the sliding window of what the front's requests measured (TTFT, token gaps,
  KV transfers), fed by `observed_backend`, which wraps the front's `ServingBackend`;
- `instances`: the instance rows (pools, liveness, KV blocks, step rate) from a router or an engine;
- `snapshot`: one JSON snapshot per tick from both, with percentiles, SLO attainment and verdict;
- `sse`: the server-sent-event framing, and the hub that builds one snapshot per tick for every viewer;
- `routes`: the page, its static files and its data routes, installed as an app extension;
- `timelines_route`: `GET /dashboard/requests`, the last request timelines (router/timeline_store.py);
- `plan_routes`, `plan_client`: the Plan view and the live prediction, answered by the plan
  worker (`python -m minipd.ops.planner.plan_worker`, a child process: the router never loads the
  simulator);
- `static/`: the page itself (HTML, CSS, vanilla JS; nothing fetched from elsewhere).
"""
