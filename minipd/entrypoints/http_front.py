"""Command-line wiring of the OpenAI HTTP front onto the router role.

The router's own `--host/--port` are its control port, so the front's flags are
`--http-host/--http-port`; with `--http-port` given, `minipd --role router` also serves
/v1/completions, /v1/chat/completions, /v1/models, /health and /metrics, and announces
`minipd: serving the OpenAI API ... on http://HOST:PORT` on stdout.
"""

from __future__ import annotations

import argparse

from aiohttp import web

from minipd.api.app import DEFAULT_HOST, DEFAULT_MAX_WAITING_REQUESTS, HttpConfig, build_app, start_http_server
from minipd.router.router import Router
from minipd.api.router_backend import RouterBackend


def add_router_http_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("OpenAI-compatible HTTP API (served when --http-port is given)")
    g.add_argument("--http-port", type=int, default=None,
                   help="serve the OpenAI API and /metrics on this port; 0 picks a free port, announced on stdout")
    g.add_argument("--http-host", default=DEFAULT_HOST, help="address the HTTP API binds (default: %(default)s)")
    g.add_argument("--served-model-name", default=None,
                   help="the model id clients pass as `model` (default: the --model value)")
    g.add_argument("--max-waiting-requests", type=int, default=DEFAULT_MAX_WAITING_REQUESTS,
                   help="answer 503 with Retry-After while this many requests wait on the instances "
                        "(default: %(default)s)")


def router_http_config(args: argparse.Namespace) -> HttpConfig:
    """Raises ValueError naming the bad flag."""
    config = HttpConfig(host=args.http_host, port=args.http_port, max_waiting_requests=args.max_waiting_requests)
    config.validate()
    return config


async def start_router_http(router: Router, args: argparse.Namespace) -> web.AppRunner:
    """Start the front on the router's loop; the caller owns the runner (`await runner.cleanup()`)."""
    config = router_http_config(args)
    model_name = args.served_model_name or router.model_name
    runner, port = await start_http_server(build_app(RouterBackend(router, model_name), config), config.host,
                                           config.port)
    print(f"minipd: serving the OpenAI API for {model_name!r} on http://{config.host}:{port}", flush=True)
    return runner


def router_http_argv(args: argparse.Namespace) -> list[str]:
    """These flags as parsed, for a launcher to pass on to its router child process."""
    if args.http_port is None:
        return []
    argv = ["--http-port", str(args.http_port), "--http-host", args.http_host,
            "--max-waiting-requests", str(args.max_waiting_requests)]
    return argv + (["--served-model-name", args.served_model_name] if args.served_model_name else [])
