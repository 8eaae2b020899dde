"""The OpenAI-compatible HTTP front (aiohttp) over any `ServingBackend`.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics, and whatever `extensions` add (the router's admin routes, ops/admin/admin.py). Every
route answers only to this server's own host names and refuses a state-changing request that
another origin's page sent (`host_guard.py`: 403, against DNS rebinding; `HttpConfig.allowed_hosts`
names more), first of all, with or without an API key. With an API key (`HttpConfig.api_key`),
every route but /health requires it (`api_key.py`; 401 otherwise, before anything but the host
is looked at), the extensions' included. POST bodies must be `application/json` (415
otherwise), so a web page cannot drive the API with a "simple"
cross-origin request (text/plain, forms). Every error, a 404 route or a 413 body included,
is answered in OpenAI's error format, and so are the requests aiohttp's own parser refuses
(`http_protocol.py`); an unexpected exception is logged and answered as a bare 500. Each app has
its own metrics registry (`app[METRICS_KEY]`), so the disaggregated flow can record KV
transfers on it and several servers can share a process.

Client disconnects cancel the request's handler (`handler_cancellation`), which aborts
the request in the backend even while it is still waiting for its first token. Slow clients
are cut off: a connection whose request headers are not complete within `header_timeout_s`
(or that idles that long between requests) is closed, and a body that has not fully arrived
within `body_timeout_s` is answered 408.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Callable, Sequence, TextIO

import msgspec
from aiohttp import web

from minipd.api.allowed_hosts import AllowedHosts, parse_entries
from minipd.api.api_key import ApiKeyGuard
from minipd.api.backend import ServingBackend
from minipd.api.errors import OVERLOADED, ApiError
from minipd.api.host_guard import HostGuard
from minipd.api.http_protocol import errors_middleware, use_json_errors
from minipd.api.metrics import CONTENT_TYPE, ServingMetrics
from minipd.api.responses import ModelCard, ModelList
from minipd.api.serving import OpenAIServing

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_WAITING_REQUESTS = 256
DEFAULT_MAX_REQUEST_BODY_BYTES = 4 * 1024 * 1024  # far above max_model_len of text, far below memory trouble
HEALTH_TIMEOUT_S = 5.0  # a backend that cannot say within this is not ready
RETRY_AFTER_S = 1
SHUTDOWN_TIMEOUT_S = 5.0  # in-flight requests are aborted after this on shutdown
DEFAULT_HEADER_TIMEOUT_S = 10.0  # far above any real client's header time on a local network
DEFAULT_BODY_TIMEOUT_S = 30.0  # a max-size body at a slow 1 Mbit/s still arrives well within it

METRICS_KEY = web.AppKey("metrics", ServingMetrics)


class HttpConfig(msgspec.Struct, frozen=True, kw_only=True):
    host: str = DEFAULT_HOST
    port: int = 0  # 0: any free port
    max_waiting_requests: int | None = DEFAULT_MAX_WAITING_REQUESTS  # None: no admission limit
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    retry_after_s: int = RETRY_AFTER_S
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S  # request headers complete within this, or closed
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # the whole body within this, or 408
    api_key: str | None = None  # None: the API is open
    # names answered besides this server's own (allowed_hosts.py); ("*",): any Host, no Origin check
    allowed_hosts: tuple[str, ...] = ()
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S  # on cleanup, requests under way get this long to finish
    plan_profile: str | None = None  # the dashboard's latency profile file (a router's --plan-profile)

    def __repr__(self) -> str:  # never print the key
        return f"HttpConfig(host={self.host!r}, port={self.port}, api_key={'<set>' if self.api_key else None})"

    def validate(self) -> None:
        if not 0 <= self.port < 2**16:
            raise ValueError(f"port: must be in [0, 65535], got {self.port}")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 0:
            raise ValueError(f"max_waiting_requests: must be >= 0, got {self.max_waiting_requests}")
        if self.max_request_body_bytes <= 0:
            raise ValueError(f"max_request_body_bytes: must be positive, got {self.max_request_body_bytes}")
        for field in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field}: must be positive, got {getattr(self, field)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key: must not be empty")
        parse_entries(self.allowed_hosts)  # ValueError naming the field


CONFIG_KEY = web.AppKey("config", HttpConfig)

_encoder = msgspec.json.Encoder()


def _json(value: msgspec.Struct | dict) -> web.Response:
    return web.Response(body=_encoder.encode(value), content_type="application/json")


class _Routes:
    """The non-generation endpoints."""

    def __init__(self, backend: ServingBackend, metrics: ServingMetrics, retry_after_s: int):
        self.backend, self.metrics, self.retry_after_s = backend, metrics, retry_after_s
        self.created = int(time.time())

    async def health(self, request: web.Request) -> web.Response:
        try:
            ready = await asyncio.wait_for(self.backend.ready(), HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            ready = False
        if not ready:
            raise ApiError(
                503, "not ready: an instance is not reachable", type=OVERLOADED, retry_after_s=self.retry_after_s
            )
        return _json({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        card = ModelCard(self.backend.model_name, self.created, self.backend.max_model_len)
        return _json(ModelList([card]))

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})


Extension = Callable[[web.Application], None]  # adds routes (and metrics) to an app before it starts


def build_app(backend: ServingBackend, config: HttpConfig, extensions: Sequence[Extension] = ()) -> web.Application:
    """An aiohttp app serving `backend`; run it with `start_http_server`."""
    config.validate()
    # a foreign Host is refused before the key is looked at: the key is no way around it
    middlewares = [errors_middleware, HostGuard(AllowedHosts.for_server(config.host, config.allowed_hosts)).middleware]
    if config.api_key is not None:
        middlewares.append(ApiKeyGuard(config.api_key).middleware)
    app = web.Application(client_max_size=config.max_request_body_bytes, middlewares=middlewares)
    metrics = ServingMetrics(backend.instance_stats)
    app[METRICS_KEY] = metrics
    backend.on_transfer_failure(lambda what: metrics.record_transfer_failure())
    app[CONFIG_KEY] = config
    serving = OpenAIServing(backend, metrics, config.max_waiting_requests, config.retry_after_s, config.body_timeout_s)

    async def close_serving(app: web.Application) -> None:
        serving.close()

    app.on_cleanup.append(close_serving)
    routes = _Routes(backend, metrics, config.retry_after_s)
    app.router.add_post("/v1/completions", serving.completions)
    app.router.add_post("/v1/chat/completions", serving.chat_completions)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/health", routes.health)
    app.router.add_get("/metrics", routes.metrics_text)
    for extend in extensions:
        extend(app)
    return app


async def start_http_server(
    app: web.Application, host: str, port: int, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S
) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (0: a free port); returns the runner (call `cleanup()`) and the port."""
    # aiohttp closes a connection that idles `keepalive_timeout` while it waits for a request:
    # from its start, and headers that arrive partly do not count as a request
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=shutdown_timeout_s,
        keepalive_timeout=app[CONFIG_KEY].header_timeout_s,
    )
    await runner.setup()
    use_json_errors(runner)  # the parser's errors too in OpenAI's format, never echoing the request
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, runner.addresses[0][1]


async def start_api(
    backend: ServingBackend, config: HttpConfig, out: TextIO = sys.stdout, extensions: Sequence[Extension] = ()
) -> web.AppRunner:
    """Serve the OpenAI API over `backend` and announce
    `minipd: serving the OpenAI API for 'MODEL' on http://HOST:PORT` on `out` once the socket
    listens (a caller that asked for port 0 learns the port). The caller owns the runner
    (`await runner.cleanup()`)."""
    runner, port = await start_http_server(
        build_app(backend, config, extensions), config.host, config.port, config.shutdown_timeout_s
    )
    print(
        f"minipd: serving the OpenAI API for {backend.model_name!r} on http://{config.host}:{port}",
        file=out,
        flush=True,
    )
    return runner
