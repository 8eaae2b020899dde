"""The router's control calls (the dashboard's buttons, and curl's): thin routes over
ops/control_loop/cluster_mode.py, link_cap.py and controller_switch.py there, and
ops/loadgen/builtin_load.py.

- `POST /admin/cluster_mode` `{"mode": "colocated"}` or `{"mode": "split", "prefill": N,
  "drain_timeout_s": S (optional, in (0, 3600])}`: switch instances in place, one at a time,
  until the cluster is colocated (`both` everywhere) or N prefill and the rest decode; answers
  the `ModeReport` (the counts after, every switch made). 409 while a change or a switch is
  under way; 502 when a switch failed (the message names those made before it, which stay).
- `POST /admin/link_cap` `{"instance": ID, "gbps": X}` (X in [0.001, 10000], or null:
  uncapped): the outgoing KV bandwidth cap of an instance that sends KV (prefill or both; 409
  for a decode instance) from its next write on; answers `LinkCapReport`.
  `GET /admin/link_cap`: the caps set through this router since it started, by instance.
- `POST /admin/load` `LoadRequest` (builtin_load.py): start the built-in load generator;
  `POST /admin/load/stop` `{}`: stop it; `GET /admin/load`: its `LoadProgress`. 409 when a run
  is under way already (start) or none is (stop).
- `POST /admin/controller` `{"on": bool, "slo": {"ttft_ms": T, "itl_ms": I | "tpot_ms": P},
  "target": F}` (every field optional; milliseconds in [0.001, 3600000], one per-token
  objective, itl or tpot): turn the ratio controller on or off and set its policy;
  `GET /admin/controller`: its `ControllerState` (with `leader`, `leader_id`).
Every body is JSON (415 otherwise), decoded strictly (400 naming an unknown or mistyped
field), and every route sits behind the app's API key (401 without it). Bad values, numbers
out of their range included, are 400s naming the field; an unknown instance is a 404; no
input gets a 5xx (tests/faults/test_admin_fuzz.py).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable

import msgspec
from aiohttp import web

from minipd.api.app import CONFIG_KEY, METRICS_KEY
from minipd.api.errors import NOT_FOUND, SERVER_ERROR, ApiError, from_decode_error
from minipd.api.json_only import require_json
from minipd.engine.sampling_params import InvalidRequestError
from minipd.ops.admin.controller_leader_metrics import ControllerLeaderCollector
from minipd.ops.control_loop.cluster_mode import ModeChangeFailed, ModeChanger
from minipd.ops.control_loop.controller_switch import ControllerSwitch
from minipd.ops.control_loop.link_cap import LinkCapConflict, LinkCapFailed, set_link_cap
from minipd.ops.loadgen.builtin_load import BuiltinLoad, LoadConflict, LoadRequest, TokenizerPrompts
from minipd.router.role_switch_driver import DEFAULT_DRAIN_TIMEOUT_S, SwitchConflict, UnknownInstance
from minipd.router.router import Router
from minipd.slo.targets import MS_PER_S, SLO, bound_ms_error


class ClusterModeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    mode: str
    prefill: int | None = None
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S


class LinkCapRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    instance: str
    gbps: float | None  # required: null lifts the cap


class ControllerSLO(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ttft_ms: float | None = None
    itl_ms: float | None = None
    tpot_ms: float | None = None


class ControllerRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    on: bool | None = None
    slo: ControllerSLO | None = None
    target: float | None = None


class StopRequest(msgspec.Struct, forbid_unknown_fields=True):
    pass


def _json(value: Any) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), content_type="application/json")


async def _body(request: web.Request, kind: type) -> Any:
    require_json(request)
    try:
        return msgspec.json.decode(await request.read(), type=kind)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc) from None


def _own_url(request: web.Request) -> str:
    """The server's base URL as this call reached it: the local end of its connection."""
    host, port = request.transport.get_extra_info("sockname")[:2]
    if ipaddress.ip_address(host).version == 6:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _slo(body: ControllerSLO) -> SLO:
    """The controller's SLO from milliseconds: each given one in range, one per-token objective."""
    if body.itl_ms is not None and body.tpot_ms is not None:
        raise InvalidRequestError("slo", "give one per-token objective, itl_ms or tpot_ms, not both")
    values = {"ttft": body.ttft_ms, "itl": body.itl_ms, "tpot": body.tpot_ms}
    for name, ms in values.items():
        error = None if ms is None else bound_ms_error(ms)
        if error is not None:
            raise InvalidRequestError("slo", f"{name}_ms: {error}")
    return SLO(**{f"{name}_s": ms / MS_PER_S for name, ms in values.items() if ms is not None})


class AdminControls:
    def __init__(self, router: Router, controller: ControllerSwitch, load: BuiltinLoad):
        self.router, self.controller, self.load = router, controller, load
        self.modes = ModeChanger(router)
        self.link_caps: dict[str, float | None] = {}  # set through this router, by instance

    def install(self, app: web.Application) -> None:
        app.router.add_post("/admin/cluster_mode", self.cluster_mode)
        app.router.add_post("/admin/link_cap", self.set_link_cap)
        app.router.add_get("/admin/link_cap", self.get_link_caps)
        app.router.add_post("/admin/load", self.start_load)
        app.router.add_post("/admin/load/stop", self.stop_load)
        app.router.add_get("/admin/load", self.load_status)
        app.router.add_post("/admin/controller", self.set_controller)
        app.router.add_get("/admin/controller", self.controller_state)

        async def stop_load(app: web.Application) -> None:
            await self.load.close()

        app.on_cleanup.append(stop_load)

    async def cluster_mode(self, request: web.Request) -> web.Response:
        body = await _body(request, ClusterModeRequest)
        try:
            report = await self.modes.change_mode(body.mode, body.prefill, body.drain_timeout_s)
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param=exc.field) from None
        except SwitchConflict as exc:
            raise ApiError(409, str(exc), param=exc.field) from None
        except ModeChangeFailed as exc:
            raise ApiError(502, str(exc), type=SERVER_ERROR) from None
        return _json({**msgspec.to_builtins(report), "switches": [msgspec.to_builtins(r) for r in report.switches]})

    async def set_link_cap(self, request: web.Request) -> web.Response:
        body = await _body(request, LinkCapRequest)
        try:
            report = await set_link_cap(
                self.router.registry, body.instance, body.gbps, self.router.config.call_timeout_s
            )
        except UnknownInstance as exc:
            raise ApiError(404, str(exc), param="instance", type=NOT_FOUND) from None
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param=exc.field) from None
        except LinkCapConflict as exc:
            raise ApiError(409, str(exc), param="instance") from None
        except LinkCapFailed as exc:
            raise ApiError(502, str(exc), type=SERVER_ERROR) from None
        self.link_caps[report.instance] = report.gbps
        return _json(report)

    async def get_link_caps(self, request: web.Request) -> web.Response:
        return _json({"link_caps": self.link_caps})

    async def start_load(self, request: web.Request) -> web.Response:
        body = await _body(request, LoadRequest)
        try:
            return _json(self.load.start(body, _own_url(request)))
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param=exc.field) from None
        except LoadConflict as exc:
            raise ApiError(409, str(exc), param="workload") from None

    async def stop_load(self, request: web.Request) -> web.Response:
        await _body(request, StopRequest)
        try:
            return _json(await self.load.stop())
        except LoadConflict as exc:
            raise ApiError(409, str(exc)) from None

    async def load_status(self, request: web.Request) -> web.Response:
        return _json(self.load.status())

    async def set_controller(self, request: web.Request) -> web.Response:
        body = await _body(request, ControllerRequest)
        try:
            slo = None if body.slo is None else _slo(body.slo)
            await self.controller.configure(on=body.on, slo=slo, target=body.target)
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param=exc.field) from None
        except ValueError as exc:  # the policy's own checks: "slo: ..." or "target: ..."
            raise ApiError(400, str(exc), param=str(exc).partition(":")[0]) from None
        return _json(self.controller.state())

    async def controller_state(self, request: web.Request) -> web.Response:
        return _json(self.controller.state())


def router_controls(router: Router, controller: ControllerSwitch) -> Callable[[web.Application], None]:
    """An app extension (`build_app(..., extensions=[...])`): the control routes above, the
    built-in load sent to this app's own port with its API key."""

    def install(app: web.Application) -> None:
        load = BuiltinLoad(TokenizerPrompts(router.tokenizer), lambda: router.max_model_len, app[CONFIG_KEY].api_key)
        AdminControls(router, controller, load).install(app)
        app[METRICS_KEY].registry.register(ControllerLeaderCollector(controller))

    return install
