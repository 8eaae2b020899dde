"""The dashboard's planner routes, answered by the plan worker (plan_client.py), never in the
router's own process:

- `GET /dashboard/plan/profiles`: the built-in latency profiles, and the one `--plan-profile`
  gave (its name, model, device), for the page's profile choice;
- `POST /dashboard/plan` with a `PlanRequest`: the Plan view (minipd/ops/planner/plan_view.py says
  what it holds); 400 naming the field for a bad input, 503 when the worker gave no answer;
- `POST /dashboard/prediction` with `{"profile": NAME}` or `{"profile_json": TEXT}` (both
  optional: the `--plan-profile` file by default): the simulator's figures for the live
  cluster's split at the arrival rate and lengths the window measured, beside the measured
  ones and their difference; `state` says `ok`, `no profile`, `no fit` (the profile is of
  another model or device than the cluster's: no figures) or `no data`.
Like the other data routes they need the API key (the app's middleware).
"""

from __future__ import annotations

import math
from typing import Callable

import msgspec
from aiohttp import web

from minipd.api.errors import OVERLOADED, ApiError, from_decode_error
from minipd.api.json_only import require_json
from minipd.ops.dashboard.plan_client import MAX_LINE_BYTES, PlanClient, PlanInputError, PlanWorkerError
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.ops.workload import WORKLOADS, LengthDist

FLAG_PROFILE = "flag"  # `profile`: the --plan-profile file
DEFAULT_BUILTIN = "llama3-8b-h100"
MAX_INSTANCES = 64
MAX_RATE_RPS = 10_000.0
MAX_SLO_MS = 3_600_000.0
MAX_LINK_GBPS = 1e6
MIN_REQUESTS, MAX_REQUESTS = 20, 2000
DEFAULT_REQUESTS = 150  # per split: 8 instances answer within a second (docs/observability.md, "Plan")
MAX_PROFILE_BYTES = MAX_LINE_BYTES // 2
PREDICT_REQUESTS = 300
MIN_MEASURED = 2  # requests in the window before a prediction is made


class PlanRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    profile: str = DEFAULT_BUILTIN  # a built-in profile's name, or "flag": the --plan-profile file
    profile_json: str | None = None  # a profile's JSON (`bench.py profile`) sent from the page: wins
    num_instances: int = 8
    mode: str = "disaggregated"  # or "colocated"
    num_prefill: int = 4  # the P of the chosen P:D split (also the split the link is judged on)
    workload: str = "mixed"
    prompt_len: str | None = None  # a LengthDist (`lognormal:1024:0.6:64:8192`); None: the workload's
    output_len: str | None = None
    rate_rps: float = 10.0
    ttft_ms: float = 500.0
    itl_ms: float = 50.0
    target: float = 0.9
    link_gbps: float | None = None  # None: the profile's
    num_requests: int = DEFAULT_REQUESTS  # simulated per split
    link_search: bool = True  # false: no search for the bandwidth where the link breaks TTFT (`link` null)


class PredictionRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    profile: str | None = None  # None: the --plan-profile file
    profile_json: str | None = None


def read_profile_file(path: str) -> str:
    """The text of a --plan-profile file (checked as a profile by the worker, on first use)."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--plan-profile: cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_PROFILE_BYTES:
        raise ValueError(f"--plan-profile: {path} is longer than {MAX_PROFILE_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"--plan-profile: {path} is not text (a latency profile's JSON)") from None


def _bad(field: str, message: str) -> ApiError:
    return ApiError(400, f"{field}: {message}", param=field)


def _number_in(body, field: str, low: float, high: float, low_open: bool = True) -> None:
    value = getattr(body, field)
    if not (math.isfinite(value) and (value > low if low_open else value >= low) and value <= high):
        raise _bad(field, f"must be a number in {'(' if low_open else '['}{low:g}, {high:g}], got {value!r}")


def check_plan(body: PlanRequest) -> None:
    """400 naming the first bad field."""
    if not 1 <= body.num_instances <= MAX_INSTANCES:
        raise _bad("num_instances", f"must be in [1, {MAX_INSTANCES}], got {body.num_instances}")
    if body.mode not in ("colocated", "disaggregated"):
        raise _bad("mode", f"must be colocated or disaggregated, got {body.mode!r}")
    if body.num_instances > 1 and not 1 <= body.num_prefill < body.num_instances:
        raise _bad("num_prefill", f"must be in [1, {body.num_instances - 1}] for {body.num_instances} instances")
    if body.num_instances == 1 and body.mode == "disaggregated":
        raise _bad("mode", "one instance can only be colocated")
    if body.workload not in WORKLOADS:
        raise _bad("workload", f"unknown {body.workload!r}; choose one of {', '.join(WORKLOADS)}")
    for field in ("prompt_len", "output_len"):
        text = getattr(body, field)
        if text is not None:
            try:
                LengthDist.parse(text)
            except ValueError as exc:
                raise _bad(field, str(exc)) from None
    _number_in(body, "rate_rps", 0, MAX_RATE_RPS)
    _number_in(body, "ttft_ms", 0, MAX_SLO_MS)
    _number_in(body, "itl_ms", 0, MAX_SLO_MS)
    _number_in(body, "target", 0, 1)
    if body.link_gbps is not None:
        _number_in(body, "link_gbps", 0, MAX_LINK_GBPS)
    if not MIN_REQUESTS <= body.num_requests <= MAX_REQUESTS:
        raise _bad("num_requests", f"must be in [{MIN_REQUESTS}, {MAX_REQUESTS}], got {body.num_requests}")


class PlanRoutes:
    """The routes above, over one `PlanClient`; `flag_profile` is the --plan-profile file's text."""

    def __init__(
        self,
        client: PlanClient,
        window: RequestWindow,
        latest: Callable[[], dict | None],
        cluster_model: str,
        flag_profile: str | None = None,
    ):
        self.client, self.window, self.latest = client, window, latest
        self.cluster_model, self.flag_profile = cluster_model, flag_profile

    def install(self, app: web.Application) -> None:
        app.router.add_get("/dashboard/plan/profiles", self.profiles)
        app.router.add_post("/dashboard/plan", self.plan)
        app.router.add_post("/dashboard/prediction", self.prediction)

        async def stop(app: web.Application) -> None:
            await self.client.close()

        app.on_cleanup.append(stop)

    def profile_spec(self, name: str | None, text: str | None) -> dict | None:
        if text is not None:
            if len(text) > MAX_PROFILE_BYTES:
                raise _bad("profile_json", f"longer than {MAX_PROFILE_BYTES} bytes")
            return {"json": text}
        if name is None or name == FLAG_PROFILE:
            if self.flag_profile is None:
                if name == FLAG_PROFILE:
                    raise _bad("profile", "the server has no --plan-profile")
                return None
            return {"json": self.flag_profile}
        if not name or len(name) > 100:
            raise _bad("profile", "give a built-in profile's name")
        return {"builtin": name}

    async def _call(self, op: str, args: dict) -> dict:
        try:
            return await self.client.call(op, args)
        except PlanInputError as exc:
            raise _bad(exc.field, str(exc).removeprefix(exc.field + ": ")) from None
        except PlanWorkerError as exc:
            raise ApiError(503, f"planner: {exc}", type=OVERLOADED) from None

    async def profiles(self, request: web.Request) -> web.Response:
        answer = await self._call(
            "profiles", {"flag": self.profile_spec(FLAG_PROFILE, None) if self.flag_profile else None}
        )
        return web.json_response(answer)

    async def plan(self, request: web.Request) -> web.Response:
        body = await _decode(request, PlanRequest)
        check_plan(body)
        args = msgspec.to_builtins(body)
        args["profile"] = self.profile_spec(args.pop("profile"), args.pop("profile_json"))
        return web.json_response(await self._call("plan", args))

    async def prediction(self, request: web.Request) -> web.Response:
        body = await _decode(request, PredictionRequest)
        spec = self.profile_spec(body.profile, body.profile_json)
        snapshot = self.latest()
        measured = measured_view(self.window, snapshot)
        if spec is None:
            return web.json_response(
                {
                    "state": "no profile",
                    "reason": "no latency profile of this cluster: start the router with --plan-profile FILE "
                    "(python bench.py profile --model MODEL --json FILE), or choose one in the Plan view",
                    "measured": measured,
                }
            )
        if measured is None or measured["requests"] < MIN_MEASURED:
            return web.json_response(
                {"state": "no data", "reason": "fewer than 2 requests in the window", "measured": measured}
            )
        args = {
            "profile": spec,
            "cluster": measured["cluster"],
            "cluster_model": self.cluster_model,
            "cluster_device": measured["device"],
            "rate_rps": measured["rate_rps"],
            "lengths": measured["lengths"],
            "num_requests": PREDICT_REQUESTS,
            "ttft_ms": snapshot["slo"]["ttft_s"] * 1e3,
            "itl_ms": snapshot["slo"]["itl_s"] * 1e3,
        }
        try:
            predicted = await self._call("predict", args)
        except ApiError as exc:
            if exc.status != 400 or exc.param in ("profile", "profile_json"):
                raise  # a bad profile is the caller's to fix; any other refusal: this cluster does not fit
            return web.json_response({"state": "no fit", "reason": str(exc), "measured": measured})
        if not predicted["fits"]:
            return web.json_response(
                {
                    "state": "no fit",
                    "reason": predicted["reason"],
                    "profile": predicted["profile"],
                    "measured": measured,
                }
            )
        return web.json_response(
            {
                "state": "ok",
                "profile": predicted["profile"],
                "measured": measured,
                "predicted": predicted,
                "error": prediction_error(measured, predicted),
            }
        )


async def _decode(request: web.Request, kind):
    require_json(request)
    try:
        return msgspec.json.decode(await request.read(), type=kind)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc) from None


def measured_view(window: RequestWindow, snapshot: dict | None) -> dict | None:
    """What the window measured, in the form the prediction needs: the split serving now, its
    device, the arrival rate (first-token instants less their TTFT: arrivals) and the (prompt,
    output) lengths of the latest finished requests, with the snapshot's percentiles."""
    if snapshot is None:
        return None
    rows = [r for pool in snapshot["pools"].values() for r in pool if r["liveness"] != "dead"]
    cluster = {pool: sum(1 for r in rows if r["pool"] == pool) for pool in ("prefill", "decode", "colocated")}
    devices = {r["compute"].rpartition("/")[2].split(":")[0] for r in rows if r["compute"]}
    arrivals = sorted(at - ttft for at, ttft in zip(window.ttft.at, window.ttft.values))
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    lengths = [[r.prompt_tokens, r.output_tokens] for r in window.records if r.error is None and r.output_tokens > 0]
    latency, attainment = snapshot["latency"], snapshot["attainment"]
    return {
        "cluster": cluster,
        "device": sorted(devices)[0] if len(devices) == 1 else None,
        "requests": len(arrivals),
        "rate_rps": (len(arrivals) - 1) / span if span > 0 else None,
        "lengths": lengths,
        "mean_prompt_tokens": sum(p for p, _ in lengths) / len(lengths) if lengths else None,
        "mean_output_tokens": sum(o for _, o in lengths) / len(lengths) if lengths else None,
        "ttft": {k: latency["ttft"][k] for k in ("p50", "p90", "p99")},
        "itl": {k: latency["itl"][k] for k in ("p50", "p90", "p99")},
        "ttft_share": attainment["ttft"],
        "itl_share": attainment["itl"],
    } | ({"requests": 0} if span <= 0 or not lengths else {})


def prediction_error(measured: dict, predicted: dict) -> dict:
    """Predicted less measured: seconds per percentile, points of attainment; None where either is missing."""
    error: dict = {}
    for kind in ("ttft", "itl"):
        error[kind] = {
            p: None
            if measured[kind][p] is None or predicted[kind][p] is None
            else predicted[kind][p] - measured[kind][p]
            for p in ("p50", "p90", "p99")
        }
        m, s = measured[f"{kind}_share"], predicted[f"{kind}_share"]
        error[f"{kind}_share"] = None if m is None or s is None else s - m
    return error
