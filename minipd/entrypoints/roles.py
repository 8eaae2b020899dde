"""The runners of the `minipd` roles: instances, the colocated server, and the router.

Instances and the router print one line `READY <role> <id> <host>:<port>` on standard output
once their control port accepts connections (the cluster launcher waits for it); every HTTP
front announces `minipd: serving the OpenAI API for 'MODEL' on http://HOST:PORT`. Then they
serve until SIGINT or SIGTERM and shut down gracefully: new requests are refused (an instance
tells its routers, which route nothing more there), the requests under way get
`--shutdown-timeout-s` to finish, the rest are aborted, blocks freed, transports closed, and
the process exits 0. The whole stop has one deadline, `--shutdown-timeout-s` after the
signal (`StopDeadline`): each step gets what is left of it, the trace exporter's last flush
too (dropped when it outlasts it, tracing/exporter.py), so a collector that never answers
cannot hold the process. The router prints `STOPPED router router` once it serves no more
(drained, its connections closed), before that flush: its launcher stops the instances then.

Each runner takes the role's typed configs (`configs.RoleConfigs`, built from the flags by
`configs.py`); the KV transport's options come from its backend's spec (`TransportConfig.options`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Coroutine

from minipd.api.app import start_api
from minipd.api.engine_backend import EngineBackend
from minipd.api.router_backend import RouterBackend
from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.engine.cpu_placement import available_cpus, cpus_text
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.model_loader import load_tokenizer_only
from minipd.entrypoints import openmp_env
from minipd.entrypoints.cluster_command import prepare_cluster
from minipd.entrypoints.config_sections import DEFAULT_CONTROLLER_SLO, ProcessConfig
from minipd.entrypoints.configs import RoleConfigs
from minipd.entrypoints.credentials import parse_cluster_secret, warn_if_exposed, warn_if_open_api
from minipd.entrypoints.prompt_demo import run_demo
from minipd.entrypoints.registration import keep_registered, register
from minipd.entrypoints.stop_signal import StopDeadline, settle_heap, wait_for_stop_signal
from minipd.ops.admin.admin import router_admin
from minipd.ops.admin.admin_controls import router_controls
from minipd.ops.admin.controller_metrics import controller_metrics
from minipd.ops.admin.scale_metrics import scale_metrics
from minipd.ops.control_loop.controller_switch import ControllerSwitch
from minipd.ops.control_loop.pool_scaler import scaler_from_launcher
from minipd.ops.dashboard.plan_routes import read_profile_file
from minipd.ops.dashboard.routes import engine_dashboard, router_dashboard
from minipd.ops.dashboard.routes import print_address as print_dashboard_address
from minipd.router.control_port import RouterControlPort
from minipd.router.router import Router
from minipd.slo.targets import SLO
from minipd.tracing import exporter as trace_exporter
from minipd.tracing.names import INSTANCE_SERVICE, ROUTER_SERVICE

CONNECT_TIMEOUT_S = 60.0
RELAY_LAST_OUTPUTS_S = 1.0  # a shutting-down router's last outputs (aborts saying why) reach its clients
DASHBOARD_SLO = SLO.parse(DEFAULT_CONTROLLER_SLO)  # what the dashboard judges against when no controller runs
RETRY_CONNECT_S = 0.2  # how often a router retries an instance that is still loading its model


def prepare(configs: RoleConfigs) -> Coroutine:
    """Load what the role must load before serving (ValueError or FileNotFoundError say what
    failed) and return the role's coroutine; the configs were validated when built."""
    role = configs.role
    if configs.process.registry is not None:
        from minipd.ops.registry.membership import require_etcd_client  # with --registry only, as below

        require_etcd_client()  # ValueError naming the flag and the extra
    if configs.process.otlp_traces_endpoint is not None:  # the SDK is there, the URL one (else ValueError)
        trace_exporter.check_endpoint(configs.process.otlp_traces_endpoint)
    if role is Role.ROUTER:
        secret = parse_cluster_secret(configs.process.cluster_secret)
        print(
            f"minipd router: placement: {_router_cpus(configs.process)}, {openmp_env.describe()}",
            file=sys.stderr,
            flush=True,
        )
        model = configs.serving.model
        router = Router(load_tokenizer_only(model), configs.router, model_name=model, secret=secret)
        return run_router(router, configs)
    if role is Role.CLUSTER:
        return prepare_cluster(configs)
    engine = load_engine(role, configs.engine)
    if role is Role.BOTH and configs.http is None and configs.instance.port is None:
        return run_demo(engine, configs.demo)
    return run_instance(configs, engine)


def load_engine(role: Role, config: EngineConfig) -> Engine:
    """Build the engine and say on stderr which model and dtype it serves, and why that dtype."""
    start = time.perf_counter()
    engine = Engine(config)
    print(
        f"minipd {role.value}: model {config.model} loaded in {time.perf_counter() - start:.1f} s, "
        f"{engine.dtype_choice.describe()}, weights {engine.model.describe_weights()}, "
        f"decode steps {'fused' if engine.runner.fused is not None else 'eager'}, "
        f"prefill {'kernels' if engine.runner.prefill is not None else 'torch ops'}",
        file=sys.stderr,
        flush=True,
    )
    print(
        f"minipd {role.value}: placement: {engine.placement.describe()}, {openmp_env.describe()}",
        file=sys.stderr,
        flush=True,
    )
    return engine


def _router_cpus(process: ProcessConfig) -> str:
    cpus = process.cpus or available_cpus()
    return f"{cpus_text(cpus)}{'' if process.cpus else ' (not pinned)'}, no model compute"


async def run_instance(configs: RoleConfigs, engine: Engine) -> int:
    """Serve `engine` as an instance on its control port (a colocated instance only when
    --control-port is given) and, with an HTTP config, the OpenAI API over the same engine."""
    role, process, http = configs.role, configs.process, configs.http
    instance_id = configs.instance.name(role, os.getpid())
    control_port = configs.instance.port
    secret = parse_cluster_secret(process.cluster_secret)
    instance = api = registration = presence = None
    stop = StopDeadline(process.shutdown_timeout_s)
    _start_tracing(process, INSTANCE_SERVICE, instance_id, role)
    try:
        if control_port is None:
            await engine.start()
        else:
            warn_if_exposed(f"{role.value} instance {instance_id}", process.host, secret)
            instance = await Instance.create(
                engine,
                role,
                instance_id,
                configs.transport.name,
                configs.serving.model,
                configs.transport.options(process),
                lease_s=configs.instance.lease_s,
                secret=secret,
                max_connections=process.max_connections,
                liveness_timeout_s=process.liveness_timeout_s,
                start_epoch=configs.instance.start_epoch,
                kv_tier=configs.instance.kv_tier,
                kv_tier_fetch=configs.instance.kv_tier_fetch,
            )
            port = await instance.serve(process.host, control_port)
        if http is not None:
            warn_if_open_api(http.host, http.api_key)
            serving = configs.serving
            backend, dashboard = engine_dashboard(
                engine,
                EngineBackend(engine, serving.model_name, kv_admission_ratio=serving.kv_admission_ratio),
                DASHBOARD_SLO,
            )
            api = await start_api(backend, http, extensions=[dashboard])
            print_dashboard_address(api, http.host)
        if instance is not None and process.registry is not None:
            from minipd.ops.registry.membership import instance_presence

            presence = instance_presence(instance, process.registry, process.host, port, process.registry_ttl_s)
            await presence.start(CONNECT_TIMEOUT_S)  # routers watching the registry find it from here on
        if instance is not None:
            print(f"READY {role.value} {instance.instance_id} {process.host}:{port}", flush=True)
            if configs.instance.router is not None:
                router = configs.instance.router
                await register(router, role, process.host, port, secret, CONNECT_TIMEOUT_S)
                registration = asyncio.get_running_loop().create_task(
                    keep_registered(instance, router, role, process.host, port, secret)
                )
        settle_heap()
        await wait_for_stop_signal()
        stop.start()
        if registration is not None:
            registration.cancel()  # a shutting-down instance does not ask to be registered again
        if api is not None:
            await api.cleanup()  # stops listening, lets its requests finish up to the deadline
            api = None
        if instance is not None:
            await instance.shutdown(stop.left_s())
            instance = None
        if presence is not None:
            await presence.close()  # its key goes once its requests are done: routers drop it then
            presence = None
        return 0
    except Exception as exc:
        print(f"minipd {role.value}: {exc}", file=sys.stderr)
        return 1
    finally:
        if registration is not None:
            registration.cancel()
        if presence is not None:
            await presence.close()
        if api is not None:
            await api.cleanup()
        if instance is not None:
            await instance.close()
        else:
            await engine.close()
        trace_exporter.shutdown(stop.left_s())  # the last spans out before the process exits


async def run_router(router: Router, configs: RoleConfigs) -> int:
    process, http, policy = configs.process, configs.http, configs.controller_policy
    server = RouterControlPort(router, process.max_connections)
    api = membership = election = None
    controller = ControllerSwitch(router, policy.policy, policy.options)
    scaler = None
    stop = StopDeadline(process.shutdown_timeout_s)
    _start_tracing(process, ROUTER_SERVICE, "router", Role.ROUTER)
    try:
        warn_if_exposed("the router", process.host, router.secret)
        scaler = await scaler_from_launcher(router, controller)  # None unless a scaling launcher started it
        deadline = asyncio.get_running_loop().time() + CONNECT_TIMEOUT_S
        for role, addresses in configs.endpoints.by_role():
            for host, port in addresses:
                await _add_with_retry(router, host, port, role, deadline)
        if process.registry is not None:
            from minipd.ops.registry.membership import router_membership

            membership = router_membership(router, process.registry, process.registry_ttl_s)
            await membership.start(CONNECT_TIMEOUT_S)  # connected to every instance published so far
        port = await server.serve(process.host, configs.endpoints.port)
        if http is not None:
            warn_if_open_api(http.host, http.api_key)
            # the API key middleware guards the admin routes as it guards the rest of the API
            backend, dashboard = router_dashboard(
                router,
                RouterBackend(router, configs.serving.served_model_name or router.model_name),
                policy.policy.slo,
                lambda: controller.controller,  # the running controller, if any (switched at runtime)
                read_profile_file(http.plan_profile) if http.plan_profile else None,
            )
            api = await start_api(
                backend,
                http,
                extensions=[
                    router_admin(router, scaler),
                    router_controls(router, controller),
                    controller_metrics(controller),
                    *([scale_metrics(scaler)] if scaler is not None else []),
                    dashboard,
                ],
            )
            print_dashboard_address(api, http.host)
        if configs.ratio_controller is not None and membership is not None:
            # several routers may serve these instances: the controller runs on the elected one
            from minipd.ops.registry.membership import controller_election

            election = controller_election(controller, process.registry, process.registry_ttl_s, membership.name)
            election.start()
        elif configs.ratio_controller is not None:
            controller.start()
        print(f"READY router router {process.host}:{port}", flush=True)
        settle_heap()
        await wait_for_stop_signal()
        stop.start()
        router.accepting = False  # new requests are refused from now on
        await server.drain(stop.left_s())  # clients' requests, relayed to their very last output
        if not await router.drain(stop.left_s()):  # those of the HTTP API
            router.abort_all(
                f"the router shut down before the request finished (its {process.shutdown_timeout_s} s "
                "shutdown deadline passed)"
            )
            await server.drain(RELAY_LAST_OUTPUTS_S)
        return 0
    except Exception as exc:
        print(f"minipd router: {exc}", file=sys.stderr)
        return 1
    finally:
        if election is not None:
            await election.close()
        await controller.stop()
        if scaler is not None:
            await scaler.close()
        if membership is not None:
            await membership.close()
        if api is not None:
            await api.cleanup()
        await server.close()
        await router.close()
        print("STOPPED router router", flush=True)  # serving no more: a launcher stops the instances now
        trace_exporter.shutdown(stop.left_s())  # the last spans out before the process exits


def _start_tracing(process: ProcessConfig, service: str, instance_id: str, role: Role) -> None:
    if process.otlp_traces_endpoint is not None:
        trace_exporter.configure(process.otlp_traces_endpoint, service, instance_id, role.value)


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
