"""The dashboard's routes on an HTTP front, installed as an app extension (`api/app.py`).

- `GET /dashboard` (and its `dashboard.js`, `kvtier.js`, `plan.js`, `dashboard.css`): the page, served from the
  package's `static/` folder. These are open (api_key.DASHBOARD_PAGE_PATHS): the page holds no
  data; with `--api-key` it asks for the key before it shows any.
- `GET /dashboard/events`: server-sent events, one `snapshot` event per tick (snapshot.py says
  what it holds), a keep-alive comment when a tick is late; at most `max_viewers` at once (503).
- `GET /dashboard/snapshot`: the latest snapshot as one JSON document (for curl).
- `GET /dashboard/requests`: the router's last request timelines (timelines_route.py).
- `POST /dashboard/slo` with `{"ttft_ms": MS, "itl_ms": MS}` (each in [0.001, 3600000]): the
  SLO the page judges against (for every viewer); 400 naming the field for a bad value.
On a router, plan_routes.py adds the planner's routes (`/dashboard/plan`, `/dashboard/prediction`).
The data routes need the API key like every other route (the app's middleware), as a Bearer
header; the page never puts the key in a URL.

`router_dashboard` and `engine_dashboard` build one for a router front or for a colocated
engine's front. On a router's front the window reads what the front's request recorder keeps
(api/metrics.py `RecentRequests`) and the router keeps its requests' events for the timelines
(router/request_log.py): the request path runs nothing of the dashboard's. A colocated front's
backend is wrapped (`ObservedBackend`), which stamps its requests' timelines and feeds the window.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

import msgspec
from aiohttp import web

from minipd.api.app import CONFIG_KEY, METRICS_KEY
from minipd.api.backend import ServingBackend
from minipd.api.errors import OVERLOADED, ApiError, from_decode_error
from minipd.api.json_only import require_json
from minipd.ops.dashboard.instances import EngineInstances, RouterInstances
from minipd.ops.dashboard.observed_backend import ObservedBackend
from minipd.ops.dashboard.plan_client import PlanClient
from minipd.ops.dashboard.plan_routes import PlanRoutes
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.ops.dashboard.snapshot import DashboardSLO, SnapshotBuilder
from minipd.ops.dashboard.sse import KEEPALIVE, SnapshotHub
from minipd.ops.dashboard.timelines_route import timelines_extension
from minipd.router.timeline_store import TimelineStore
from minipd.slo.targets import SLO, bound_ms_error

if TYPE_CHECKING:
    from minipd.engine.engine import Engine
    from minipd.router.router import Router

STATIC = Path(__file__).parent / "static"
PAGE_FILES = {
    "/dashboard": ("dashboard.html", "text/html"),
    "/dashboard/dashboard.js": ("dashboard.js", "text/javascript"),
    "/dashboard/dashboard.css": ("dashboard.css", "text/css"),
    "/dashboard/plan.js": ("plan.js", "text/javascript"),
    "/dashboard/timelines.js": ("timelines.js", "text/javascript"),
    "/dashboard/kvtier.js": ("kvtier.js", "text/javascript"),
    "/dashboard/timelines.css": ("timelines.css", "text/css"),
}
# the page runs only what it ships: no inline script, nothing from another origin, never framed
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
KEEPALIVE_S = 5.0  # a comment when no snapshot came for this long, so proxies keep the stream open
MAX_VIEWERS = 32


class SloRequest(msgspec.Struct, forbid_unknown_fields=True):
    ttft_ms: float
    itl_ms: float


class Dashboard:
    def __init__(self, builder: SnapshotBuilder, interval_s: float = 1.0, max_viewers: int = MAX_VIEWERS):
        self.builder = builder
        self.hub = SnapshotHub(builder.build, interval_s, max_viewers)

    def install(self, app: web.Application) -> None:
        for path in PAGE_FILES:
            app.router.add_get(path, self.page)
        app.router.add_get("/dashboard/events", self.events)
        app.router.add_get("/dashboard/snapshot", self.snapshot)
        app.router.add_post("/dashboard/slo", self.set_slo)

        async def start(app: web.Application) -> None:
            self.hub.start()

        async def stop(app: web.Application) -> None:  # before aiohttp waits for handlers: streams end
            await self.hub.close()

        app.on_startup.append(start)
        app.on_shutdown.append(stop)

    async def page(self, request: web.Request) -> web.Response:
        name, content_type = PAGE_FILES[request.path]
        body = (STATIC / name).read_bytes()
        if name.endswith(".html"):  # the page asks for a key before any data call when the server has one
            auth = b"none" if request.app[CONFIG_KEY].api_key is None else b"required"
            body = body.replace(b"{{AUTH}}", auth)
        return web.Response(body=body, content_type=content_type, charset="utf-8", headers=PAGE_HEADERS)

    async def snapshot(self, request: web.Request) -> web.Response:
        if self.hub.snapshot is None:
            await self.hub.tick()
        return web.Response(body=msgspec.json.encode(self.hub.snapshot), content_type="application/json")

    async def set_slo(self, request: web.Request) -> web.Response:
        require_json(request)
        try:
            body = msgspec.json.decode(await request.read(), type=SloRequest)
        except msgspec.DecodeError as exc:
            raise from_decode_error(exc) from None
        for field in ("ttft_ms", "itl_ms"):
            error = bound_ms_error(getattr(body, field))
            if error is not None:
                raise ApiError(400, f"{field}: {error}", param=field)
        slo = self.builder.set_slo(body.ttft_ms / 1e3, body.itl_ms / 1e3)
        await self.hub.tick()  # every viewer sees the new lines now, not a tick later
        return web.Response(body=msgspec.json.encode(slo), content_type="application/json")

    async def events(self, request: web.Request) -> web.StreamResponse:
        hub = self.hub
        if hub.num_viewers >= hub.max_viewers:
            raise ApiError(503, f"the dashboard has {hub.max_viewers} viewers already", type=OVERLOADED)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        hub.num_viewers += 1
        try:
            seen = hub.version
            if hub.version:
                await response.write(hub.frame)  # the newest at once, not a tick later
            while not hub.closed:
                seen, frame = await hub.next_frame(seen, KEEPALIVE_S)
                if hub.closed:
                    break
                await response.write(frame if frame is not None else KEEPALIVE)
        except ConnectionError:
            pass  # the viewer went away
        finally:
            hub.num_viewers -= 1
        return response


def print_address(runner: web.AppRunner, host: str, out: TextIO = sys.stdout) -> None:
    """`minipd: dashboard on http://HOST:PORT/dashboard`, once the front listens."""
    print(f"minipd: dashboard on http://{host}:{runner.addresses[0][1]}/dashboard", file=out, flush=True)


def router_dashboard(
    router: Router,
    backend: ServingBackend,
    default_slo: SLO,
    controller: Callable[[], object | None],
    plan_profile: str | None = None,
) -> tuple:
    """(backend to serve, app extension) for the router's front; `controller()` is the ratio
    controller running now (None: off); the SLO is its own while it runs, else `default_slo`
    (until one is set from the page). `plan_profile` is the text of the --plan-profile file:
    the latency profile the live prediction uses (plan_routes.py)."""

    window = RequestWindow()
    builder = SnapshotBuilder(
        window,
        RouterInstances(router),
        DashboardSLO.from_slo(default_slo, "default"),
        "router",
        # the router's control calls (ops/admin/admin.py, ops/admin/admin_controls.py) the page may make
        {"role_switch": True, "cluster_mode": True, "link_cap": True, "load": True, "controller": True, "plan": True},
        controller,
    )
    dashboard = Dashboard(builder)
    router.timelines = TimelineStore()  # the router keeps every request's events from now on
    plan = PlanRoutes(PlanClient(), window, lambda: dashboard.hub.snapshot, router.model_name, plan_profile)

    def read_front(app: web.Application) -> None:  # the front's recorder keeps what the window reads
        window.read(app[METRICS_KEY].recent)

    return backend, _both(read_front, dashboard.install, timelines_extension(router.timelines), plan.install)


def engine_dashboard(engine: Engine, backend: ServingBackend, default_slo: SLO, name: str = "local") -> tuple:
    """(backend to serve, app extension) for a colocated engine's front (no role switch there)."""
    window = RequestWindow()
    builder = SnapshotBuilder(
        window, EngineInstances(engine, name), DashboardSLO.from_slo(default_slo, "default"), "colocated", {}
    )
    dashboard = Dashboard(builder)
    timelines = TimelineStore()  # no router here: the front stamps its requests' phases itself
    observed = ObservedBackend(backend, window, timelines, name)
    return observed, _both(dashboard.install, timelines_extension(timelines))


def _both(*extensions: Callable[[web.Application], None]) -> Callable[[web.Application], None]:
    def install(app: web.Application) -> None:
        for extension in extensions:
            extension(app)

    return install
