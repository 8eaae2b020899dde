"""`minipd --role cluster`: a whole local cluster as processes on this host.

Starts the prefill, decode and colocated instances (`minipd --role prefill|decode|both`),
waits for each to print its READY line, starts the router pointed at them, and prints where
to send requests. It runs from the role's checked configs (`configs.RoleConfigs`): the
instances' cores are planned from its `EngineConfig`. Each child's command line is derived
from the flags this command parsed (`RoleConfigs.parsed`, `flags.inherited_argv`), with its
own share of the cores (`cpu_plan.py`: `--cpus`, `--torch-threads`) and passive OpenMP
waiting in its environment (`openmp_env.py`); secrets go to the children through their
environment (`flags.inherited_env`). Without
`--cluster-secret`, a fresh random secret is generated for the cluster, so its control plane
and KV links are always authenticated; `cluster_secret` holds it for clients in this process
(`client()`).
With `--prompt`, answers the prompts through the client API (printing tokens, TTFT, ITL
and KV transfer figures) and shuts down; otherwise serves until Ctrl-C. Every child is
stopped on exit (SIGTERM, then SIGKILL once its shutdown deadline and a grace period passed).

For tests and the soak benchmark: `restart(name)` replaces a child with a fresh process that
registers with the router, `rejoin(name)` registers a living child again at once (the router
also redials the children it lost by itself, router/instance_links.py), and `fault_dir`
starts the children with fault points enabled (`minipd.transports.fault_points`); each
child's `FAULT` lines arrive on `Child.faults`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import NamedTuple

from minipd.control.handshake import open_channel
from minipd.control.messages import Register
from minipd.control.role import Role
from minipd.engine.model_loader import load_tokenizer_only
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.configs import RoleConfigs, role_configs
from minipd.entrypoints.cpu_plan import ROUTER, plan_cluster
from minipd.entrypoints.credentials import parse_cluster_secret
from minipd.entrypoints.flags import build_parser, inherited_argv, inherited_env
from minipd.entrypoints.openmp_env import passive_env
from minipd.entrypoints.prompt_demo import answer_prompts, chat_wrapper
from minipd.entrypoints.stop_signal import wait_for_stop_signal
from minipd.router.cluster_client import ClusterClient
from minipd.transports import fault_points
from minipd.transports.shared_secret import SharedSecret, generate_secret_text

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0  # after a child's own shutdown deadline
REGISTER_TIMEOUT_S = 30.0


class Child(NamedTuple):
    name: str
    role: Role
    process: asyncio.subprocess.Process
    address: tuple[str, int]
    announcements: list[str]  # lines it printed before READY (e.g. where its HTTP API listens)
    argv: list[str]  # its command line after `--role ROLE`
    faults: asyncio.Queue  # (point, detail) of each fault point it reached


class ProcessCluster:
    """The processes of one local cluster, from the configs of a `minipd --role cluster` command line:
    `start` then `stop` (also used by tests and benchmarks, through `from_argv`)."""

    def __init__(self, configs: RoleConfigs, fault_dir: str | None = None) -> None:
        self.secret_generated = configs.process.cluster_secret is None
        if self.secret_generated:
            configs = configs.with_cluster_secret(generate_secret_text())
        self.configs = configs
        self.cluster_secret: SharedSecret = parse_cluster_secret(configs.process.cluster_secret)
        self.children: list[Child] = []
        self.router_address: tuple[str, int] | None = None
        engine = configs.engine  # validated for the instances: their cores and threads are planned from it
        self.placement = plan_cluster(
            [name for name, _ in self._instances()], engine.cpus, engine.torch_threads, engine.cpu_placement
        )
        self.fault_dir = fault_dir

    @property
    def args(self) -> argparse.Namespace:
        """The flags as parsed (the generated cluster secret included), passed on to the children."""
        return self.configs.parsed

    @classmethod
    def from_argv(cls, argv: list[str], fault_dir: str | None = None) -> "ProcessCluster":
        """The cluster that `minipd --role cluster ARGV` would start (flags checked the same way);
        with `fault_dir`, its children's fault points are armed by files there."""
        args = build_parser(Role.CLUSTER).parse_args(["--role", Role.CLUSTER.value, *argv])
        return cls(role_configs(Role.CLUSTER, args), fault_dir)

    def _instances(self) -> list[tuple[str, Role]]:
        cluster = self.configs.cluster
        return (
            [(f"{_NAMES[Role.PREFILL]}-{i}", Role.PREFILL) for i in range(cluster.num_prefill)]
            + [(f"{_NAMES[Role.DECODE]}-{i}", Role.DECODE) for i in range(cluster.num_decode)]
            + [(f"{_NAMES[Role.BOTH]}-{i}", Role.BOTH) for i in range(cluster.num_colocated)]
        )

    def _child_argv(self, name: str, role: Role) -> list[str]:
        """The flags `role` inherits, with this child's share of the cores in place of the
        launcher's own `--cpus` and `--torch-threads`."""
        share = self.placement[name]
        args = argparse.Namespace(**{**vars(self.args), "cpus": share.cpus, "torch_threads": share.torch_threads})
        return inherited_argv(args, Role.CLUSTER, role)

    async def start(self) -> None:
        instances = self._instances()
        try:
            await asyncio.gather(
                *(
                    self._spawn(
                        name,
                        role,
                        ["--instance-id", name, _CONTROL_PORT_FLAG[role], "0", *self._child_argv(name, role)],
                    )
                    for name, role in instances
                )
            )
            order = [name for name, _ in instances]
            self.children.sort(key=lambda c: order.index(c.name))  # as listed, however they came up
            addresses = [
                item
                for child in self.children
                for item in (_ROUTER_FLAG[child.role], f"{child.address[0]}:{child.address[1]}")
            ]
            router = await self._spawn(ROUTER, Role.ROUTER, [*self._child_argv(ROUTER, Role.ROUTER), *addresses])
        except BaseException:
            await self.stop()
            raise
        self.router_address = router.address

    def placement_lines(self) -> list[str]:
        """One line per process: its threads and cores."""
        return [f"placement: {name}: {share.describe()}" for name, share in self.placement.items()]

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    async def client(self, timeout: float = 30.0) -> ClusterClient:
        """A client of the started cluster's router, authenticated with the cluster's secret."""
        return await ClusterClient.connect(*self.router_address, timeout=timeout, secret=self.cluster_secret)

    def arm(self, point: str, action: str = "stop") -> None:
        """Arm a fault point for the children (the first to reach it fires it); needs `fault_dir`."""
        if self.fault_dir is None:
            raise RuntimeError("this cluster was started without a fault_dir")
        fault_points.write_armed(self.fault_dir, point, action)

    def disarm(self) -> list[str]:
        """Disarm the fault points no child reached; returns their names."""
        return fault_points.clear_armed(self.fault_dir) if self.fault_dir is not None else []

    async def restart(self, name: str) -> Child:
        """Kill child `name` (if it still runs), start a fresh one with the same command line,
        and register it with the router; returns the new child."""
        old = self.child(name)
        if old.process.returncode is None:
            old.process.kill()
        await old.process.wait()
        index = self.children.index(old)
        self.children.remove(old)
        child = await self._spawn(name, old.role, old.argv)
        self.children.remove(child)
        self.children.insert(index, child)  # the router stays last: `stop` ends it first
        await self.rejoin(name)
        return child

    async def rejoin(self, name: str) -> None:
        """Have the router register child `name` (running, but no longer registered)."""
        host, port = self.child(name).address
        channel, _ = await open_channel(
            *self.router_address, None, f"rejoin-{name}", self.child(name).role, self.cluster_secret, REGISTER_TIMEOUT_S
        )
        try:
            await channel.call(Register(host=host, port=port), REGISTER_TIMEOUT_S)
        finally:
            await channel.close()

    async def _spawn(self, name: str, role: Role, argv: list[str]) -> Child:
        env = dict(os.environ)
        if self.configs.engine.cpu_placement:
            env = passive_env(env)  # read when torch loads
        if self.fault_dir is not None:
            env[fault_points.ENV_DIR] = self.fault_dir
        for variable, value in inherited_env(self.args, Role.CLUSTER, role).items():
            if value is None:
                env.pop(variable, None)
            else:
                env[variable] = value
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "minipd", "--role", role.value, *argv, stdout=asyncio.subprocess.PIPE, env=env
        )
        announcements: list[str] = []
        try:
            address = await asyncio.wait_for(self._wait_ready(name, process, announcements), READY_TIMEOUT_S)
        except BaseException:
            process.kill()
            await process.wait()
            raise
        child = Child(name, role, process, address, announcements, argv, asyncio.Queue())
        self.children.append(child)
        asyncio.get_running_loop().create_task(self._drain(child))
        return child

    @staticmethod
    async def _wait_ready(name: str, process: asyncio.subprocess.Process, announcements: list[str]) -> tuple[str, int]:
        while True:
            line = (await process.stdout.readline()).decode()
            if not line:
                raise RuntimeError(
                    f"{name} exited with status {await process.wait()} before it was ready (its error is above)"
                )
            if line.startswith("READY "):
                host, _, port = line.split()[-1].rpartition(":")
                return host, int(port)
            announcements.append(line.rstrip())

    @staticmethod
    async def _drain(child: Child) -> None:
        while line := (await child.process.stdout.readline()).decode():
            if line.startswith("FAULT "):
                _, point, *detail = line.split()
                child.faults.put_nowait((point, " ".join(detail)))

    async def stop(self) -> None:
        """Router first (so no new work reaches the instances), then the instances, together."""
        routers = [c for c in self.children if c.role is Role.ROUTER]
        for group in (routers, [c for c in self.children if c.role is not Role.ROUTER]):
            await asyncio.gather(*(self._stop_child(child) for child in group))

    async def _stop_child(self, child: Child) -> None:
        if child.process.returncode is not None:
            return
        grace_s = self.configs.process.shutdown_timeout_s + STOP_GRACE_S
        child.process.send_signal(signal.SIGCONT)  # one stopped at a fault point must hear the SIGTERM
        child.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(child.process.wait(), grace_s)
        except asyncio.TimeoutError:
            log.warning("%s did not stop in %s s; killing it", child.name, grace_s)
            child.process.kill()
            await child.process.wait()


def prepare_cluster(configs: RoleConfigs) -> Coroutine:
    """`minipd --role cluster`: the run of the cluster its validated configs describe (the
    router's tokenizer is loaded first, so a bad --model fails before any process starts)."""
    tokenizer = load_tokenizer_only(configs.serving.model)
    demo = configs.demo
    return run_cluster(
        ProcessCluster(configs), demo.prompts, demo.sampling, chat_wrapper(tokenizer) if demo.chat else None
    )


async def run_cluster(
    cluster: ProcessCluster, prompts: list[str], params: SamplingParams, wrap: Callable[[str], str] | None = None
) -> int:
    """Start the cluster, print where it serves, answer `prompts` (each passed through `wrap`
    first, when given) or serve until Ctrl-C, then stop every process."""
    stop = asyncio.create_task(wait_for_stop_signal())
    try:
        for line in cluster.placement_lines():
            print(line, flush=True)
        await cluster.start()
        host, port = cluster.router_address
        roles = ", ".join(f"{c.name} at {c.address[0]}:{c.address[1]}" for c in cluster.children[:-1])
        print(f"cluster ready ({cluster.configs.transport.name} KV transport): {roles}", flush=True)
        print(
            f"router: {host}:{port}  (Python: await minipd.ClusterClient.connect({host!r}, {port}, "
            f"secret=os.environ['MINIPD_CLUSTER_SECRET']))",
            flush=True,
        )
        if cluster.secret_generated:
            print(
                "the cluster secret was generated for this run and is known only to its processes; to connect "
                "clients of your own, start the cluster with MINIPD_CLUSTER_SECRET set",
                flush=True,
            )
        for line in cluster.child("router").announcements:
            print(line, flush=True)
        if prompts:
            client = await cluster.client()
            try:
                return await answer_prompts(client, prompts, params, wrap=wrap)
            finally:
                await client.close()
        print("serving; Ctrl-C stops every process", flush=True)
        await stop
        return 0
    except RuntimeError as exc:
        print(f"minipd cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        stop.cancel()
        await cluster.stop()


_NAMES = {Role.PREFILL: "prefill", Role.DECODE: "decode", Role.BOTH: "colocated"}
_CONTROL_PORT_FLAG = {Role.PREFILL: "--port", Role.DECODE: "--port", Role.BOTH: "--control-port"}
_ROUTER_FLAG = {Role.PREFILL: "--prefill", Role.DECODE: "--decode", Role.BOTH: "--colocated"}
