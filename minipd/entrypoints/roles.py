"""The long-running roles of the `minipd` binary: prefill and decode instances, and the router.

Each prints one line `READY <role> <id> <host>:<port>` on standard output once it accepts
connections (the local cluster launcher waits for it), then serves until SIGINT or SIGTERM,
and shuts down cleanly: requests aborted, blocks freed, transports closed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from minipd.control.channel import Channel
from minipd.control.messages import Register
from minipd.engine.engine import Engine
from minipd.disagg.instance import DEFAULT_LEASE_S, Instance
from minipd.engine.model_loader import load_tokenizer_only
from minipd.router.router import Router, RouterConfig
from minipd.router.control_port import RouterServer

log = logging.getLogger(__name__)

DEFAULT_ROUTER_PORT = 8100
CONNECT_TIMEOUT_S = 60.0


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def add_instance_arguments(parser: argparse.ArgumentParser) -> None:
    from minipd.transports.registry import BACKENDS

    g = parser.add_argument_group("instance")
    g.add_argument("--host", default="127.0.0.1", help="address of the control port (default: %(default)s)")
    g.add_argument("--port", type=int, default=0, help="control port; 0 picks a free one (default: 0)")
    g.add_argument("--instance-id", default=None, help="name in the cluster (default: ROLE-PID)")
    g.add_argument("--transport", default="tcp", choices=sorted(BACKENDS),
                   help="KV transfer backend; loopback works only inside one process (default: %(default)s)")
    g.add_argument("--link-gbps", type=float, default=None,
                   help="cap this instance's outgoing KV bandwidth, in gigabits per second (default: no cap)")
    g.add_argument("--lease-s", type=float, default=DEFAULT_LEASE_S,
                   help="decode: free a reservation whose decode has not started after this long "
                        "(default: %(default)s)")
    g.add_argument("--router", type=parse_address, default=None, metavar="HOST:PORT",
                   help="register with this router once serving (default: the router is told by its flags)")


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("router")
    g.add_argument("--host", default="127.0.0.1", help="address of the client/registration port (default: %(default)s)")
    g.add_argument("--port", type=int, default=DEFAULT_ROUTER_PORT,
                   help="port for clients (minipd.router.client) and instance registration; 0 picks a free one "
                        "(default: %(default)s)")
    g.add_argument("--prefill", type=parse_address, action="append", default=[], metavar="HOST:PORT",
                   help="a prefill instance's control port; repeat for several")
    g.add_argument("--decode", type=parse_address, action="append", default=[], metavar="HOST:PORT",
                   help="a decode instance's control port; repeat for several")
    add_router_policy_arguments(parser)


def add_router_policy_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("routing policy")
    g.add_argument("--local-prefill-max-tokens", type=int, default=RouterConfig().local_prefill_max_tokens,
                   help="prompts with at most this many uncached tokens are prefilled on the decode instance "
                        "itself (conditional disaggregation); -1 disables (default: %(default)s)")
    g.add_argument("--no-layerwise", dest="layerwise", action="store_false",
                   help="send the KV after the whole prefill instead of layer by layer (for comparison)")


def router_policy_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--local-prefill-max-tokens", str(args.local_prefill_max_tokens)]
    return argv if args.layerwise else argv + ["--no-layerwise"]


def router_config_from_args(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(local_prefill_max_tokens=args.local_prefill_max_tokens, layerwise=args.layerwise)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def run_instance(role: str, args: argparse.Namespace, engine: Engine) -> int:
    options = {"link_gbps": args.link_gbps} if args.link_gbps else {}
    if args.transport == "tcp":
        options["host"] = args.host
    instance_id = args.instance_id or f"{role}-{os.getpid()}"
    instance = None
    try:
        instance = await Instance.create(engine, role, instance_id, args.transport,
                                         args.model, options, lease_s=args.lease_s)
        port = await instance.serve(args.host, args.port)
        print(f"READY {role} {instance.instance_id} {args.host}:{port}", flush=True)
        if args.router is not None:
            channel = await Channel.connect(*args.router, None, "register", CONNECT_TIMEOUT_S)
            try:
                await channel.call(Register(host=args.host, port=port), CONNECT_TIMEOUT_S)
            finally:
                await channel.close()
        await _until_signalled()
        return 0
    except Exception as exc:
        print(f"minipd {role}: {exc}", file=sys.stderr)
        return 1
    finally:
        if instance is not None:
            await instance.close()


async def _add_with_retry(router: Router, host: str, port: int, deadline: float) -> None:
    """Instances may still be loading their model: retry refused connections until the deadline."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            await router.add_instance(host, port)
            return
        except (ConnectionError, OSError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)  # polling a port that is not open yet


async def run_router(args: argparse.Namespace) -> int:
    router = Router(load_tokenizer_only(args.model), router_config_from_args(args), model_name=args.model)
    server = RouterServer(router)
    http = None
    try:
        deadline = asyncio.get_running_loop().time() + CONNECT_TIMEOUT_S
        for host, port in args.prefill + args.decode:
            await _add_with_retry(router, host, port, deadline)
        port = await server.serve(args.host, args.port)
        if getattr(args, "http_port", None) is not None:
            from minipd.entrypoints.http_front import start_router_http
            http = await start_router_http(router, args)
        print(f"READY router router {args.host}:{port}", flush=True)
        await _until_signalled()
        return 0
    except Exception as exc:
        print(f"minipd router: {exc}", file=sys.stderr)
        return 1
    finally:
        if http is not None:
            await http.cleanup()
        await server.close()
        await router.close()
