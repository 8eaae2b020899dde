"""The processes of a local cluster (`minipd --role cluster`; its run: `cluster_command.py`).

Starts the prefill, decode and colocated instances (`minipd --role prefill|decode|both`),
waits for each to print its READY line, and starts the router pointed at them (with
`--registry`, the router finds them in etcd instead, and a restarted instance there too). It runs from
the role's checked configs (`configs.RoleConfigs`): the instances' cores are planned from its
`EngineConfig`. Each child's command line is derived from the flags this command parsed
(`RoleConfigs.parsed`, `flags.inherited_argv`), with its own share of the cores
(`cpu_plan.py`: `--cpus`, `--torch-threads`) and passive OpenMP waiting in its environment
(`openmp_env.py`); secrets go to the children through their environment
(`flags.inherited_env`). Without `--cluster-secret`, a fresh random secret is generated for
the cluster, so its control plane and KV links are always authenticated; `cluster_secret`
holds it for clients in this process (`client()`).

Every child inherits the read end of the launcher's pipe (`launcher_pipe.py`) and stops by
itself once the launcher is gone, however it died. A child's stderr is held until it is
ready, then relayed (`child_stderr.py`): one that fails to start raises RuntimeError quoting
its own error line, and `start` stops the others. `stop` stops every child (the router
first, the instances once it serves no more; SIGTERM, then SIGKILL once its shutdown
deadline and a grace period passed);
`kill_all` kills them at once. `add_instance` and `remove_instance` change the instances while
the cluster runs (the Ray launcher's pool scaling, ray_scaling.py).

`restart(name)` replaces a child with a fresh process (an instance registers with the
router; a router takes the old one's ports and connects to every instance): the launcher's
`Supervisor` uses it, and so do tests and the soak benchmark. `rejoin(name)` registers a
living child again at once (the router also redials the children it lost by itself,
router/instance_links.py), and `fault_dir` starts the children
with fault points enabled (`minipd.transports.fault_points`); each child's `FAULT` lines
arrive on `Child.faults`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import NamedTuple

from minipd.control.handshake import open_channel
from minipd.control.messages import Register
from minipd.control.role import Role
from minipd.entrypoints.child_spawn import kill_process, spawn_process
from minipd.entrypoints.child_stderr import ChildStderr
from minipd.entrypoints.configs import RoleConfigs, role_configs
from minipd.entrypoints.cpu_plan import ROUTER, plan_cluster
from minipd.entrypoints.credentials import parse_cluster_secret
from minipd.entrypoints.flags import build_parser, inherited_argv, inherited_env
from minipd.entrypoints.launcher_pipe import LauncherPipe
from minipd.entrypoints.openmp_env import passive_env
from minipd.entrypoints.restart_epoch import restarted_argv
from minipd.entrypoints.tier_master import LOCAL_MASTER, SupervisedMaster
from minipd.kvtier.mooncake_master import MasterFailed
from minipd.ops.control_loop.scale_link import ENV_FD as SCALE_LINK_ENV
from minipd.router.cluster_client import ClusterClient
from minipd.transports import fault_points
from minipd.transports.shared_secret import SharedSecret, generate_secret_text

log = logging.getLogger(__name__)

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
    stderr: ChildStderr  # relayed to the launcher's
    serving_ended: asyncio.Event | None = None  # set at its `STOPPED` line (a router: it serves no more)


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
        self._pipe: LauncherPipe | None = None  # children stop by themselves once it closes
        self._processes: set[asyncio.subprocess.Process] = set()  # every one started, ready or not
        self.children_changed = asyncio.Event()  # set when an instance is added or removed while running
        self._restarts: dict[str, int] = {}  # per instance name: how often it was restarted
        # `--kv-tier mooncake`: a master of the cluster's own, its URL given to every instance
        self.tier_master = SupervisedMaster() if configs.instance.kv_tier == LOCAL_MASTER else None

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
        own = {"cpus": share.cpus, "torch_threads": share.torch_threads}
        if self.tier_master is not None:
            own["kv_tier"] = self.tier_master.url
        return inherited_argv(argparse.Namespace(**{**vars(self.args), **own}), Role.CLUSTER, role)

    async def start(self) -> None:
        """Start the instances together, then the router; the first that fails to start stops
        the others (RuntimeError quoting its error line). A master of the cluster's own
        (`--kv-tier mooncake`) starts first: the instances open the tier as they start."""
        if self.tier_master is not None:
            try:
                await self.tier_master.start()
            except (MasterFailed, FileNotFoundError) as exc:
                raise RuntimeError(f"kv-tier: the cluster's Mooncake master did not start: {exc}") from None
            print(f"kv-tier: the cluster's Mooncake master at {self.tier_master.url}", flush=True)
        spawns = [
            asyncio.ensure_future(
                self._spawn(
                    name, role, ["--instance-id", name, _CONTROL_PORT_FLAG[role], "0", *self._child_argv(name, role)]
                )
            )
            for name, role in self._instances()
        ]
        try:
            await asyncio.wait(spawns, return_when=asyncio.FIRST_EXCEPTION)
            failed = [s for s in spawns if s.done() and not s.cancelled() and s.exception() is not None]
            if failed:
                raise failed[0].exception()
            self.children.extend(s.result() for s in spawns)  # as listed, however they came up
            router = await self._spawn(ROUTER, Role.ROUTER, self._router_argv())
            self.children.append(router)
        except BaseException:
            for spawn in spawns:
                spawn.cancel()
            await asyncio.gather(*spawns, return_exceptions=True)
            started = [s.result() for s in spawns if not s.cancelled() and s.exception() is None]
            self.children.extend(c for c in started if c not in self.children)
            await self.stop()
            raise
        self.router_address = router.address

    def _router_argv(self) -> list[str]:
        """The router's command line: the instances as they are now; a router that replaces
        another takes the ports it listened on (its clients find it where they left it)."""
        argv = [*self._child_argv(ROUTER, Role.ROUTER)]
        for child in self.children:
            if child.role is not Role.ROUTER and self.args.registry is None:  # else it finds them there
                argv += [_ROUTER_FLAG[child.role], f"{child.address[0]}:{child.address[1]}"]
        if self.router_address is not None:
            argv += ["--port", str(self.router_address[1])]
            http = next((line for line in self.child(ROUTER).announcements if line.startswith(_HTTP_ANNOUNCED)), None)
            if http is not None:
                argv += ["--http-port", http.rpartition(":")[2].strip("/")]
        return argv

    def http_url(self) -> str | None:
        """Where the router serves the OpenAI API (`http://HOST:PORT`), from its announcement;
        None without `--http-port`."""
        line = next((a for a in self.child(ROUTER).announcements if a.startswith(_HTTP_ANNOUNCED)), None)
        return line.rsplit(" on ", 1)[1] if line is not None else None

    def placement_lines(self) -> list[str]:
        """One line per process: its threads and cores."""
        return [f"placement: {name}: {share.describe()}" for name, share in self.placement.items()]

    def ready_lines(self) -> list[str]:
        """Lines to print once the cluster is ready, about where its processes run (none here:
        `placement_lines` said it all)."""
        return []

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
        """Kill child `name` (if it still runs) and start a fresh one with the same command
        line: an instance then registers with the router (unless the router is down: a new
        router connects to it); a router takes the old one's ports and connects to every
        instance. Returns the new child; RuntimeError when it did not start (the old one stays
        listed, dead)."""
        old = self.child(name)
        kill_process(old.process)
        await old.process.wait()
        if old.role is Role.ROUTER:
            argv = self._router_argv()
        else:
            self._restarts[name] = self._restarts.get(name, 0) + 1
            argv = restarted_argv(old.argv, self._restarts[name])
        child = await self._spawn(name, old.role, argv)
        self.children[self.children.index(old)] = child  # the router stays last: `stop` ends it first
        router = self.child(ROUTER) if old.role is not Role.ROUTER else None
        if router is not None and router.process.returncode is None and self.args.registry is None:
            try:
                await self.rejoin(name)
            except Exception as exc:
                kill_process(child.process)
                await child.process.wait()
                raise RuntimeError(f"the router did not take the restarted {name}: {exc}") from None
        return child

    async def add_instance(self, name: str, role: Role) -> Child:
        """Start one more instance `name` (its cores planned in `placement` already) while the
        cluster runs, and register it with the router; supervised like the others from then
        on. RuntimeError when it did not start or the router did not take it (it is stopped)."""
        argv = ["--instance-id", name, _CONTROL_PORT_FLAG[role], "0", *self._child_argv(name, role)]
        child = await self._spawn(name, role, argv)
        routers = [i for i, c in enumerate(self.children) if c.role is Role.ROUTER]
        self.children.insert(routers[0] if routers else len(self.children), child)  # the router stays last
        self.children_changed.set()
        if self.args.registry is None:  # else it registers there by itself
            try:
                await self.rejoin(name)
            except Exception as exc:
                await self.remove_instance(name)
                raise RuntimeError(f"the router did not take the added {name}: {exc}") from None
        return child

    async def remove_instance(self, name: str) -> None:
        """Stop instance `name` for good, as `stop` stops one (SIGTERM: its own graceful
        drain, then SIGKILL past the deadline); it is no longer supervised."""
        child = self.child(name)
        self.children.remove(child)
        self.children_changed.set()
        await self._stop_child(child)
        await child.stderr.drained()

    def _router_scale_socket(self):
        """A socket whose descriptor a router about to start inherits as its scale link
        (ops/control_loop/scale_link.py); None: this launcher does not scale pools."""
        return None

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

    def _child_env(self, role: Role, base: dict[str, str]) -> dict[str, str]:
        """`base` with what a `role` child needs: passive OpenMP waiting, the fault points, and
        the secrets it inherits (never on its command line)."""
        env = dict(base)
        if self.configs.engine.cpu_placement:
            env = passive_env(env)  # read when torch loads
        if self.fault_dir is not None:
            env[fault_points.ENV_DIR] = self.fault_dir
        for variable, value in inherited_env(self.args, Role.CLUSTER, role).items():
            if value is None:
                env.pop(variable, None)
            else:
                env[variable] = value
        return env

    async def _spawn(self, name: str, role: Role, argv: list[str]) -> Child:
        if self._pipe is None:
            self._pipe = LauncherPipe()
        env = {**self._child_env(role, dict(os.environ)), **self._pipe.child_env()}
        pass_fds = self._pipe.pass_fds
        scale_end = self._router_scale_socket() if role is Role.ROUTER else None
        if scale_end is not None:
            env[SCALE_LINK_ENV] = str(scale_end.fileno())
            pass_fds = (*pass_fds, scale_end.fileno())
        try:
            process, address, announcements, stderr = await spawn_process(
                name, role, argv, env, pass_fds, self._processes.add
            )
        finally:
            if scale_end is not None:
                scale_end.close()  # the router holds its own copy
        stderr.release()
        child = Child(name, role, process, address, announcements, argv, asyncio.Queue(), stderr, asyncio.Event())
        asyncio.get_running_loop().create_task(self._drain(child))
        return child

    def kill_all(self) -> None:
        """SIGKILL every child, ready or still starting: what they were doing is abandoned."""
        for process in self._processes:
            kill_process(process)

    @staticmethod
    async def _drain(child: Child) -> None:
        while line := (await child.process.stdout.readline()).decode():
            if line.startswith("FAULT "):
                _, point, *detail = line.split()
                child.faults.put_nowait((point, " ".join(detail)))
            elif line.startswith("STOPPED ") and child.serving_ended is not None:
                child.serving_ended.set()

    async def stop(self) -> None:
        """Router first (so no new work reaches the instances), then the instances, together,
        once the router serves no more: its `STOPPED` line (drained, its connections closed;
        its trace exporter may still be flushing) or its exit. So the exporters' last flushes
        overlap, and a cluster stops within one `--shutdown-timeout-s` after the router's
        drain. Then the launcher's pipe closes (a child still running would stop by itself)."""
        routers = [asyncio.ensure_future(self._stop_child(c)) for c in self._routers()]
        await asyncio.gather(*(self._until_serving_ended(c, t) for c, t in zip(self._routers(), routers)))
        instances = [self._stop_child(c) for c in self.children if c.role is not Role.ROUTER]
        await asyncio.gather(*routers, *instances)
        await asyncio.gather(*(child.stderr.drained() for child in self.children))  # their last lines too
        if self.tier_master is not None:  # after the instances: their tiers close while it answers
            await self.tier_master.stop()
        self._processes = {p for p in self._processes if p.returncode is None}
        if self._pipe is not None and not self._processes:
            self._pipe.close()
            self._pipe = None

    def _routers(self) -> list[Child]:
        return [c for c in self.children if c.role is Role.ROUTER]

    @staticmethod
    async def _until_serving_ended(child: Child, stopping: asyncio.Future) -> None:
        """Until `child` said it serves no more, or its stop (`stopping`) ended."""
        if child.serving_ended is None:
            await asyncio.wait({stopping})
            return
        said = asyncio.ensure_future(child.serving_ended.wait())
        await asyncio.wait({said, stopping}, return_when=asyncio.FIRST_COMPLETED)
        said.cancel()

    async def _stop_child(self, child: Child) -> None:
        if child.process.returncode is not None:
            return
        grace_s = self.configs.process.shutdown_timeout_s + STOP_GRACE_S
        try:
            child.process.send_signal(signal.SIGCONT)  # one stopped at a fault point must hear the SIGTERM
            child.process.send_signal(signal.SIGTERM)
        except ProcessLookupError:  # it exited a moment ago
            pass
        try:
            await asyncio.wait_for(child.process.wait(), grace_s)
        except asyncio.TimeoutError:
            log.warning("%s did not stop in %s s; killing it", child.name, grace_s)
            kill_process(child.process)
            await child.process.wait()


_HTTP_ANNOUNCED = "minipd: serving the OpenAI API"
_NAMES = {Role.PREFILL: "prefill", Role.DECODE: "decode", Role.BOTH: "colocated"}
_CONTROL_PORT_FLAG = {Role.PREFILL: "--port", Role.DECODE: "--port", Role.BOTH: "--control-port"}
_ROUTER_FLAG = {Role.PREFILL: "--prefill", Role.DECODE: "--decode", Role.BOTH: "--colocated"}
