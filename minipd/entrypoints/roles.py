"""The runners of the `minipd` roles: instances, the colocated server, and the router.

Instances and the router print one line `READY <role> <id> <host>:<port>` on standard output
once their control port accepts connections (the cluster launcher waits for it); every HTTP
front announces `minipd: serving the OpenAI API for 'MODEL' on http://HOST:PORT`. Then they
serve until SIGINT or SIGTERM and shut down gracefully: new requests are refused (an instance
tells its routers, which route nothing more there), the requests under way get
`--shutdown-timeout-s` to finish, the rest are aborted, blocks freed, transports closed, and
the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Coroutine
from pathlib import Path

import msgspec

from minipd.api.admin import router_admin
from minipd.api.app import HttpConfig, start_api
from minipd.api.engine_backend import EngineBackend
from minipd.api.router_backend import RouterBackend
from minipd.control.handshake import open_channel
from minipd.control.messages import Register
from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.engine.cpu_placement import available_cpus, cpus_text
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.kv_admission import validate_ratio
from minipd.engine.model_loader import load_tokenizer_only
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints import openmp_env
from minipd.entrypoints.credentials import (
    api_key_from_args,
    cluster_secret_from_args,
    warn_if_exposed,
    warn_if_open_api,
)
from minipd.entrypoints.prompt_demo import run_demo
from minipd.entrypoints.signals import wait_for_stop_signal
from minipd.policy.ratio_controller import ControllerConfig
from minipd.router.control_port import RouterControlPort
from minipd.router.live_controller import LiveControllerOptions, LiveRatioController
from minipd.router.router import Router, RouterConfig
from minipd.slo.targets import SLO
from minipd.transports.shared_secret import SharedSecret

CONNECT_TIMEOUT_S = 60.0
RELAY_LAST_OUTPUTS_S = 1.0  # a shutting-down router's last outputs (aborts saying why) reach its clients
RETRY_CONNECT_S = 0.2  # how often a router retries an instance that is still loading its model


def prepare(role: Role, args: argparse.Namespace) -> Coroutine:
    """Validate everything `role` needs (ValueError names the flag), load what must be loaded
    before serving, and return the role's coroutine."""
    if role is Role.ROUTER:
        secret = cluster_secret_from_args(args)
        http = http_config(args.http_host, args.http_port, args)
        print(f"minipd router: placement: {_router_cpus(args)}, {openmp_env.describe()}", file=sys.stderr, flush=True)
        router = Router(
            load_tokenizer_only(args.model), router_config_from_args(args), model_name=args.model, secret=secret
        )
        return run_router(router, args, http, controller_from_args(args))
    if role is Role.CLUSTER:
        from minipd.entrypoints.process_cluster import prepare_cluster

        return prepare_cluster(args)
    config = engine_config_from_args(args)
    if args.step_log_dir:
        step_log = str(Path(args.step_log_dir) / f"{instance_id_from_args(role, args)}.jsonl")
        config = msgspec.structs.replace(config, step_log=step_log)
    cluster_secret_from_args(args)  # checked before the model loads
    if role is Role.BOTH:
        params = demo_params(args)
        http = http_config(args.host, args.port, args)
        if http is None and args.control_port is None:
            return run_demo(load_engine(role, config), args.prompt, params, chat=args.chat)
        return run_instance(role, args, load_engine(role, config), http)
    return run_instance(role, args, load_engine(role, config))


def instance_id_from_args(role: Role, args: argparse.Namespace) -> str:
    return args.instance_id or f"{role.value}-{os.getpid()}"


def load_engine(role: Role, config: EngineConfig) -> Engine:
    """Build the engine and say on stderr which model and dtype it serves, and why that dtype."""
    start = time.perf_counter()
    engine = Engine(config)
    print(
        f"minipd {role.value}: model {config.model} loaded in {time.perf_counter() - start:.1f} s, "
        f"{engine.dtype_choice.describe()}, weights {engine.config.weights}",
        file=sys.stderr,
        flush=True,
    )
    print(
        f"minipd {role.value}: placement: {engine.placement.describe()}, {openmp_env.describe()}",
        file=sys.stderr,
        flush=True,
    )
    return engine


def _router_cpus(args: argparse.Namespace) -> str:
    cpus = args.cpus or available_cpus()
    return f"{cpus_text(cpus)}{'' if args.cpus else ' (not pinned)'}, no model compute"


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The flags named after `EngineConfig` fields, validated (ValueError names the field)."""
    config = EngineConfig(**{f: getattr(args, f) for f in EngineConfig.__struct_fields__ if hasattr(args, f)})
    config.validate()
    return config


def router_config_from_args(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(**{f: getattr(args, f) for f in RouterConfig.__struct_fields__ if hasattr(args, f)})


def controller_from_args(args: argparse.Namespace) -> tuple[ControllerConfig, LiveControllerOptions] | None:
    """The ratio controller's policy and options when --ratio-controller is given (ValueError
    naming the flag for a bad value), else None."""
    if not args.ratio_controller:
        return None
    try:
        slo = SLO.parse(args.controller_slo)
    except ValueError as exc:
        raise ValueError(f"controller_slo: {exc}") from None
    policy = ControllerConfig(
        slo=slo,
        target=args.controller_target,
        hysteresis=args.controller_hysteresis,
        window_s=args.controller_window_s,
        cooldown_s=args.controller_cooldown_s,
        min_samples=args.controller_min_samples,
    )  # ValueError names the field
    return policy, LiveControllerOptions(
        interval_s=args.controller_interval_s, drain_timeout_s=args.controller_drain_timeout_s
    )


def http_config(host: str, port: int | None, args: argparse.Namespace) -> HttpConfig | None:
    """The HTTP front's config when a port is given, else None (raises ValueError naming the flag)."""
    if port is None:
        return None
    validate_ratio(args.kv_admission_ratio)
    config = HttpConfig(
        host=host,
        port=port,
        max_waiting_requests=args.max_waiting_requests,
        header_timeout_s=args.http_header_timeout_s,
        body_timeout_s=args.http_body_timeout_s,
        api_key=api_key_from_args(args),
        shutdown_timeout_s=args.shutdown_timeout_s,
    )
    config.validate()
    return config


def demo_params(args: argparse.Namespace) -> SamplingParams:
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    params.validate(vocab_size=2**31)  # token-id fields are checked against the model later
    return params


async def run_instance(role: Role, args: argparse.Namespace, engine: Engine, http: HttpConfig | None = None) -> int:
    """Serve `engine` as a `role` instance on its control port (a colocated instance only when
    --control-port is given) and, with `http`, the OpenAI API over the same engine."""
    options = {"link_gbps": args.link_gbps} if args.link_gbps else {}
    if args.liveness_timeout_s > 0:
        options["stall_timeout_s"] = args.liveness_timeout_s  # a KV send stuck this long fails like a dead peer
    if args.transport == "tcp":
        options.update(host=args.host, max_connections=args.max_connections)
    instance_id = instance_id_from_args(role, args)
    control_port = args.port if role is not Role.BOTH else args.control_port
    secret = cluster_secret_from_args(args)
    instance = api = None
    try:
        if control_port is None:
            await engine.start()
        else:
            warn_if_exposed(f"{role.value} instance {instance_id}", args.host, secret)
            instance = await Instance.create(
                engine,
                role,
                instance_id,
                args.transport,
                args.model,
                options,
                lease_s=args.lease_s,
                secret=secret,
                max_connections=args.max_connections,
                liveness_timeout_s=args.liveness_timeout_s,
            )
            port = await instance.serve(args.host, control_port)
        if http is not None:
            warn_if_open_api(http.host, http.api_key)
            api = await start_api(
                EngineBackend(engine, args.served_model_name or args.model, kv_admission_ratio=args.kv_admission_ratio),
                http,
            )
        if instance is not None:
            print(f"READY {role.value} {instance.instance_id} {args.host}:{port}", flush=True)
            if args.router is not None:
                await _register(args.router, role, args.host, port, secret)
        await wait_for_stop_signal()
        if api is not None:
            await api.cleanup()  # stops listening, lets its requests finish up to the deadline
            api = None
        if instance is not None:
            await instance.shutdown(args.shutdown_timeout_s)
            instance = None
        return 0
    except Exception as exc:
        print(f"minipd {role.value}: {exc}", file=sys.stderr)
        return 1
    finally:
        if api is not None:
            await api.cleanup()
        if instance is not None:
            await instance.close()
        else:
            await engine.close()


async def _register(router: tuple[str, int], role: Role, host: str, port: int, secret: SharedSecret | None) -> None:
    channel, _ = await open_channel(*router, None, "register", role, secret, CONNECT_TIMEOUT_S)
    try:
        await channel.call(Register(host=host, port=port), CONNECT_TIMEOUT_S)
    finally:
        await channel.close()


async def run_router(
    router: Router,
    args: argparse.Namespace,
    http: HttpConfig | None,
    controller: tuple[ControllerConfig, LiveControllerOptions] | None = None,
) -> int:
    server = RouterControlPort(router, args.max_connections)
    api = live_controller = None
    try:
        warn_if_exposed("the router", args.host, router.secret)
        deadline = asyncio.get_running_loop().time() + CONNECT_TIMEOUT_S
        for role, addresses in ((Role.PREFILL, args.prefill), (Role.DECODE, args.decode), (Role.BOTH, args.colocated)):
            for host, port in addresses:
                await _add_with_retry(router, host, port, role, deadline)
        port = await server.serve(args.host, args.port)
        if http is not None:
            warn_if_open_api(http.host, http.api_key)
            # the API key middleware guards the admin routes as it guards the rest of the API
            api = await start_api(
                RouterBackend(router, args.served_model_name or router.model_name),
                http,
                extensions=[router_admin(router)],
            )
        if controller is not None:
            live_controller = LiveRatioController(router, *controller)
            live_controller.start()
        print(f"READY router router {args.host}:{port}", flush=True)
        await wait_for_stop_signal()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + args.shutdown_timeout_s
        router.accepting = False  # new requests are refused from now on
        await server.drain(args.shutdown_timeout_s)  # clients' requests, relayed to their very last output
        if not await router.drain(max(0.0, deadline - loop.time())):  # those of the HTTP API
            router.abort_all(
                f"the router shut down before the request finished (its {args.shutdown_timeout_s} s "
                "shutdown deadline passed)"
            )
            await server.drain(RELAY_LAST_OUTPUTS_S)
        return 0
    except Exception as exc:
        print(f"minipd router: {exc}", file=sys.stderr)
        return 1
    finally:
        if live_controller is not None:
            await live_controller.close()
        if api is not None:
            await api.cleanup()
        await server.close()
        await router.close()


async def _add_with_retry(router: Router, host: str, port: int, role: Role, deadline: float) -> None:
    """Instances may still be loading their model: retry refused connections until the deadline."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            await router.add_instance(host, port, expected_role=role)
            return
        except (ConnectionError, OSError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(RETRY_CONNECT_S)  # polling a port that is not open yet
