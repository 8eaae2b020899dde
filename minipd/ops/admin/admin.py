"""The router's admin endpoints, and the router's own series on /metrics.

- `POST /admin/switch_role` with `{"instance": ID, "role": "prefill"|"decode"|"both",
  "drain_timeout_s": S (optional: 120, more than 0, at most 3600)}`: switch one instance's role in place
  (`Router.switch_role`) and answer the `SwitchReport` as JSON once it serves in its new role.
  Errors, OpenAI-shaped and naming the field: 400 (bad body, unknown role, bad timeout),
  404 (unknown instance), 409 (already that role, already switching, the last decode
  instance), 504 (the drain outlasted its timeout; nothing changed), 502 (the instance
  refused or was lost).
- `GET /admin/instances`: every instance's id, role, epoch, whether it is switching and what
  it computes on (`Welcome.compute`, such as `node1/cpu:0`), and every role change so far;
  on a router whose launcher scales pools (ops/control_loop/pool_scaler.py), also whether each
  instance is draining to be removed, the pool sizes and bounds, and the scale events
  (`ScaleEvent`: adding, added, draining, removing, removed or failed).
Both are guarded by the app's API key like every other route; the POST takes only
`application/json` bodies (415 otherwise, json_only.py).

/metrics gains (`RouterCollector`, read from the router at scrape time):
`minipd_role_switches{instance,from_role,to_role}`, `minipd_role_switch_seconds` (the last
switch's time, drain included and excluded), `minipd_instance_role_epoch{instance}`,
`minipd_local_prefill_decisions{placement}` and `minipd_stale_epoch_retries`; and
`minipd_disagg_decisions_total{decision}` (disagg_decisions.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable

import msgspec
from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from minipd.api.app import METRICS_KEY
from minipd.api.errors import NOT_FOUND, SERVER_ERROR, ApiError, from_decode_error
from minipd.api.json_only import require_json
from minipd.control.messages import DRAIN_TIMEOUT
from minipd.engine.sampling_params import InvalidRequestError
from minipd.ops.admin.disagg_decisions import DisaggDecisionCollector
from minipd.ops.control_loop.pool_scaler import LivePoolScaler
from minipd.policy.local_prefill import Placement
from minipd.router.role_switch_driver import DEFAULT_DRAIN_TIMEOUT_S, SwitchConflict, SwitchFailed, UnknownInstance
from minipd.router.router import Router


class SwitchRoleRequest(msgspec.Struct, forbid_unknown_fields=True):
    instance: str
    role: str
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S


def _json(value) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), content_type="application/json")


class AdminRoutes:
    def __init__(self, router: Router, scaler: LivePoolScaler | None = None):
        self.router, self.scaler = router, scaler

    def install(self, app: web.Application) -> None:
        app.router.add_post("/admin/switch_role", self.switch_role)
        app.router.add_get("/admin/instances", self.instances)

    async def switch_role(self, request: web.Request) -> web.Response:
        require_json(request)
        try:
            body = msgspec.json.decode(await request.read(), type=SwitchRoleRequest)
        except msgspec.DecodeError as exc:
            raise from_decode_error(exc) from None
        try:
            report = await self.router.switch_role(body.instance, body.role, body.drain_timeout_s)
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param=exc.field) from None
        except UnknownInstance as exc:
            raise ApiError(404, str(exc), param="instance", type=NOT_FOUND) from None
        except SwitchConflict as exc:
            raise ApiError(409, str(exc), param=exc.field) from None
        except SwitchFailed as exc:
            raise ApiError(504 if exc.kind == DRAIN_TIMEOUT else 502, str(exc), type=SERVER_ERROR) from None
        return _json({**msgspec.to_builtins(report), "excluding_drain_s": report.excluding_drain_s})

    async def instances(self, request: web.Request) -> web.Response:
        handles = sorted(self.router.registry.alive(), key=lambda h: h.instance_id)
        removing = self.scaler.removing if self.scaler is not None else set()
        instances = [
            {
                "instance": h.instance_id,
                "role": h.role.value,
                "epoch": h.epoch,
                "switching": _switching(h) and h.instance_id not in removing,
                "compute": h.welcome.compute,
            }
            for h in handles
        ]
        body = {"instances": instances, "role_changes": msgspec.to_builtins(self.router.role_changes)}
        if self.scaler is not None:
            for entry in instances:
                entry["removing"] = entry["instance"] in removing
            body["pools"] = {role.value: n for role, n in self.scaler.pool_sizes().items()}
            body["pool_bounds"] = msgspec.to_builtins(self.scaler.config.bounds)
            body["scale_events"] = msgspec.to_builtins(self.scaler.events)
        return _json(body)


class RouterCollector(Collector):
    """The router's role switches and placement decisions, read at scrape time."""

    def __init__(self, router: Router):
        self.router = router

    def collect(self) -> Iterable[Metric]:
        router = self.router
        switches = CounterMetricFamily(
            "minipd_role_switches", "Completed in-place role switches", labels=["instance", "from_role", "to_role"]
        )
        for (instance, src, dst), n in Counter(
            (c.instance_id, c.from_role.value, c.to_role.value) for c in router.role_changes
        ).items():
            switches.add_metric([instance, src, dst], n)
        last = GaugeMetricFamily(
            "minipd_role_switch_seconds", "The last role switch: decision to serving in the new role", labels=["drain"]
        )
        if router.role_changes:
            report = router.role_changes[-1]
            last.add_metric(["included"], report.total_s)
            last.add_metric(["excluded"], report.excluding_drain_s)
        epochs = GaugeMetricFamily(
            "minipd_instance_role_epoch", "Role epoch of each instance (switches so far)", labels=["instance"]
        )
        for handle in router.registry.alive():
            epochs.add_metric([handle.instance_id], handle.epoch)
        placements = CounterMetricFamily(
            "minipd_local_prefill_decisions",
            "Where prompts were prefilled, by the local-prefill policy's reason",
            labels=["placement"],
        )
        for placement in Placement:
            placements.add_metric([placement.value], router.counters.placements[placement])
        stale = CounterMetricFamily("minipd_stale_epoch_retries", "Tries refused for a stale role epoch and retried")
        stale.add_metric([], router.counters.num_stale_retries)
        migrated = CounterMetricFamily(
            "minipd_requests_migrated",
            "Requests gone on on another instance after their decode instance was lost mid-stream",
        )
        migrated.add_metric([], router.counters.num_migrations)
        yield from (switches, last, epochs, placements, stale, migrated)


def router_admin(router: Router, scaler: LivePoolScaler | None = None) -> Callable[[web.Application], None]:
    """An app extension (`build_app(..., extensions=[...])`): the admin routes and the router's series."""

    def install(app: web.Application) -> None:
        AdminRoutes(router, scaler).install(app)
        app[METRICS_KEY].registry.register(RouterCollector(router))
        app[METRICS_KEY].registry.register(DisaggDecisionCollector(router.counters))

    return install


def _switching(handle) -> bool:
    """This router's own switch drains the instance, or another router's does (its stats say so)."""
    return handle.draining or (handle.stats is not None and handle.stats.switching)
