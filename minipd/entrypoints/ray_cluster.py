"""`minipd --role cluster --launcher ray`: the instances are placed on a Ray cluster.

`RayCluster` is the local launcher's `ProcessCluster` with one difference: an instance is not
a child process of the launcher but a process started by a Ray actor (`ray_instance.py`)
placed by Ray resources: the instance's share of the CPUs (as the local launcher plans it),
one GPU with `--device cuda`, and the role's custom resources (`--ray-prefill-resources`,
`--ray-decode-resources`). The router still runs here, started as the local launcher starts
it, with the instances' addresses the actors report. Supervision is the local launcher's
(`Supervisor`): an instance whose process dies is started again by its actor, registers with
the router again, and the restarts are bounded by `--max-restarts` and logged; an actor that
dies, or whose node is lost, is restarted by Ray (`max_restarts`) on a node with room for it,
and its process, which watched the actor's pipe, stops by itself. The launcher sees that
instance end `lost with its Ray actor` (`RayProcess.exit_reason`), and its restart asks the
actor again (Ray answers ActorUnavailableError until it has placed it anew) within
`PLACEMENT_TIMEOUT_S`, then starts the instance there; an actor Ray no longer restarts fails
the restart naming it, one more death for the supervisor's bound.

Without `--ray-address` a local Ray is started for the run (`ray.init` with an explicit
`num_cpus`, its own temp dir, printed) and shut down at the end, which ends its processes; the
temp dir is removed (with pool scaling, ray_scaling.py, it has the CPUs of every instance the
pools may grow to). With one, the launcher joins that cluster as a driver: its actors end
with it. Every wait on Ray is bounded: an instance whose resources no node has fails at once
naming them, one that no node has room for within `PLACEMENT_TIMEOUT_S` fails naming them too.

`--kv-tier mooncake`: the cluster's own Mooncake master runs beside the launcher, supervised as
the local launcher does it (tier_master.py), at this host's address on Ray's network, so the
instances reach it from any node.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import tempfile
import uuid

import ray

from minipd.control.role import Role
from minipd.entrypoints.child_spawn import READY_TIMEOUT_S
from minipd.entrypoints.configs import RoleConfigs
from minipd.entrypoints.cpu_plan import ROUTER, plan_cluster
from minipd.entrypoints.flags import inherited_env
from minipd.entrypoints.process_cluster import Child, ProcessCluster
from minipd.entrypoints.ray_instance import InstanceSupervisor
from minipd.entrypoints.ray_scaling import RayPoolScaling
from minipd.entrypoints.tier_master import SupervisedMaster

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 120.0  # for Ray to find a node with room for an instance and start its worker there
UNAVAILABLE_RETRY_S = 0.5  # between asks to an actor Ray is placing again (its node was lost)
CALL_MARGIN_S = 30.0  # on top of an actor's own bounded work (a busy node, a slow Ray)


class RayProcess:
    """The launcher's view of an instance process a Ray actor started: what `ProcessCluster`
    and `Supervisor` use of an asyncio subprocess (pid, returncode, wait, signals)."""

    def __init__(self, actor, pid: int) -> None:
        self.pid, self.returncode, self.actor_error = pid, None, None
        self._actor = actor
        self._exit = asyncio.wrap_future(actor.wait.remote(pid).future())
        self._exit.add_done_callback(self._exited)

    def _exited(self, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        if future.exception() is not None:  # the actor died: its process stopped by itself (the pipe)
            self.actor_error = _first_line(future.exception())
            self.returncode = -signal.SIGKILL
        else:
            self.returncode = future.result()

    @property
    def exit_reason(self) -> str | None:
        """How it ended when not by itself: with its actor (its node lost, or the actor killed)."""
        return f"lost with its Ray actor: {self.actor_error}" if self.actor_error else None

    async def wait(self) -> int:
        await asyncio.wait([self._exit])  # the shared future survives a waiter that is cancelled
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            self._actor.signal.remote(self.pid, int(signum))

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _RelayedByActor:
    """An instance's stderr: its actor relays it, and Ray forwards it to the launcher's."""

    async def drained(self) -> None:
        return None


class RayCluster(ProcessCluster):
    def __init__(self, configs: RoleConfigs) -> None:
        super().__init__(configs)
        self.temp_dir: str | None = None  # of the local Ray started for the run
        self.placed: dict[str, dict] = {}  # instance name -> what its actor reported at its last start
        self._run = uuid.uuid4().hex[:8]
        self._actors: dict[str, object] = {}
        self._secret_refs: dict[Role, object] = {}
        self._node: str | None = None
        self._connected = False
        scaling = configs.cluster.scaling()
        self.scaling = None if scaling is None else RayPoolScaling(self, scaling)  # ray_scaling.py
        if self.scaling is not None:  # every slot the pools may grow to gets its cores now
            engine = configs.engine
            slots = [name for name, _ in self.scaling.slot_names()]
            self.placement = plan_cluster(slots, engine.cpus, engine.torch_threads, engine.cpu_placement)

    # ---- placement
    def _cpu_count(self, name: str) -> int:
        share = self.placement[name]
        return len(share.cpus) if self.configs.engine.cpu_placement and share.cpus else 1

    def _resources(self, name: str, role: Role) -> dict[str, float]:
        """What instance `name` asks Ray for."""
        cluster = self.configs.cluster
        custom = cluster.ray_prefill_resources if role is Role.PREFILL else cluster.ray_decode_resources
        wanted = {"CPU": float(self._cpu_count(name)), **dict(custom)}
        if self.configs.engine.device.startswith("cuda"):
            wanted["GPU"] = 1.0
        return wanted

    def placement_lines(self) -> list[str]:
        lines = [
            f"placement: {name}: a Ray actor asking for {_text(self._resources(name, role))}"
            for name, role in self._instances()
        ]
        scaling = [self.scaling.describe()] if self.scaling is not None else []
        return [*lines, f"placement: {ROUTER}: {self.placement[ROUTER].describe()} (this host)", *scaling]

    def ready_lines(self) -> list[str]:
        return [
            f"ray: {name} on node {info['node_ip']} ({info['node_id'][:12]}), assigned {_text(info['assigned'])}, "
            f"actor pid {info['actor_pid']}, instance pid {info['pid']}: {info['placement']}"
            for name, info in self.placed.items()
        ]

    # ---- Ray
    def _connect(self) -> None:
        """Start or join Ray, on the launcher's own thread (Ray's driver must live and shut down
        on one thread; from another, a local Ray's shutdown aborts the process). `ray.init`
        replaces the SIGTERM handler with its own exit; the launcher's is put back."""
        launcher_handler = signal.getsignal(signal.SIGTERM)
        try:
            self._init()
        finally:
            signal.signal(signal.SIGTERM, launcher_handler)
        self._connected = True
        self._node = ray.get_runtime_context().get_node_id()

    def _init(self) -> None:
        address = self.configs.cluster.ray_address
        if address is None:
            self.temp_dir = tempfile.mkdtemp(prefix="minipd-ray-")
            cpus = sum(self._cpu_count(name) for name in self.placement if name != ROUTER)  # every slot
            ray.init(num_cpus=cpus, _temp_dir=self.temp_dir, namespace=f"minipd-{self._run}", log_to_driver=True)
        else:
            ray.init(address=address, namespace=f"minipd-{self._run}", log_to_driver=True)

    async def start(self) -> None:
        try:
            self._connect()  # blocks the loop for Ray's start; a stop signal meanwhile is handled after it
        except Exception as exc:
            await self._disconnect()
            where = self.configs.cluster.ray_address or "a local Ray"
            raise RuntimeError(f"could not start or join {where}: {exc}") from None
        if self.temp_dir is not None:
            print(f"ray: a local Ray for this run, temp dir {self.temp_dir}", flush=True)
        if self.tier_master is not None:  # `--kv-tier mooncake`: beside the launcher, where every node reaches it
            self.tier_master = SupervisedMaster(host=ray.util.get_node_ip_address())
        await super().start()  # stops everything on failure (self.stop)

    def _check_feasible(self, name: str, wanted: dict[str, float]) -> None:
        """Fail at once when no alive node of the cluster has every resource `wanted`."""
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        if any(all(node.get(k, 0.0) >= v for k, v in wanted.items()) for node in nodes):
            return
        missing = sorted(k for k, v in wanted.items() if not any(node.get(k, 0.0) >= v for node in nodes))
        raise RuntimeError(
            f"{name} asks Ray for {_text(wanted)}, and no node of the Ray cluster has "
            f"{', '.join(missing) or 'them all on one node'} (its nodes: "
            f"{'; '.join(_text({k: v for k, v in n.items() if not k.startswith('node:')}) for n in nodes)})"
        )

    def _actor(self, name: str, role: Role):
        actor = self._actors.get(name)
        if actor is None:
            wanted = self._resources(name, role)
            self._check_feasible(name, wanted)
            custom = {k: v for k, v in wanted.items() if k not in ("CPU", "GPU")}
            actor = (
                ray.remote(InstanceSupervisor)
                .options(
                    name=f"minipd-{self._run}-{name}",
                    num_cpus=wanted["CPU"],
                    num_gpus=wanted.get("GPU", 0),
                    resources=custom,
                    max_restarts=self.configs.cluster.max_restarts,
                    max_concurrency=16,  # wait, signal and start of one instance run at once
                )
                .remote(name, role.value)
            )
            self._actors[name] = actor
        return actor

    def _secret_ref(self, role: Role):
        """The role's secret environment variables as a Ray object (only its id is in the
        actor's task spec)."""
        if role not in self._secret_refs:
            self._secret_refs[role] = ray.put(inherited_env(self.args, Role.CLUSTER, role))
        return self._secret_refs[role]

    async def _spawn(self, name: str, role: Role, argv: list[str]) -> Child:
        if role is Role.ROUTER:
            return await super()._spawn(name, role, argv)
        actor = self._actor(name, role)
        wanted = self._resources(name, role)
        try:
            await asyncio.wait_for(_placed(actor), PLACEMENT_TIMEOUT_S)
        except asyncio.TimeoutError:
            free = ray.available_resources()
            why = (
                "Ray had room for it, but its worker process did not start in time (a busy machine?)"
                if all(free.get(k, 0.0) >= v for k, v in wanted.items())
                else f"no node of the Ray cluster had {_text(wanted)} free"
            )
            raise RuntimeError(
                f"{name} was not placed within {PLACEMENT_TIMEOUT_S:.0f} s: {why} (see `ray status`)"
            ) from None
        except ray.exceptions.ActorDiedError as exc:  # Ray gave up on it: max_restarts used up
            raise RuntimeError(
                f"{name}: Ray does not restart its actor again ({self.configs.cluster.max_restarts} restarts "
                f"at most, --max-restarts): {_first_line(exc)}"
            ) from None
        except ray.exceptions.RayError as exc:
            raise RuntimeError(f"{name}: its Ray actor failed: {_first_line(exc)}") from None
        share = self.placement[name]
        call = actor.start.remote(
            argv,
            [self._secret_ref(role)],
            list(share.cpus) if share.cpus else None,
            self._node,
            self.configs.engine.cpu_placement,
            self.configs.engine.torch_threads,
        )
        try:
            info = await asyncio.wait_for(asyncio.wrap_future(call.future()), READY_TIMEOUT_S + CALL_MARGIN_S)
        except asyncio.TimeoutError:
            raise RuntimeError(f"{name} was not ready within {READY_TIMEOUT_S + CALL_MARGIN_S:.0f} s") from None
        except ray.exceptions.RayTaskError as exc:  # the spawn's own RuntimeError, quoting the child
            raise RuntimeError(str(exc.cause) if exc.cause else str(exc).splitlines()[-1]) from None
        except ray.exceptions.RayError as exc:
            raise RuntimeError(f"{name}: its Ray actor failed: {_first_line(exc)}") from None
        process = RayProcess(actor, info["pid"])
        self._processes.add(process)
        self.placed[name] = info
        address = (info["host"], info["port"])
        return Child(name, role, process, address, info["announcements"], argv, asyncio.Queue(), _RelayedByActor())

    def _router_scale_socket(self):
        return self.scaling.router_socket() if self.scaling is not None else None

    async def remove_instance(self, name: str) -> None:
        """The instance stopped as the local launcher stops one, then its actor killed."""
        await super().remove_instance(name)
        actor = self._actors.pop(name, None)
        self.placed.pop(name, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    async def stop(self) -> None:
        """Every process stopped as the local launcher stops them (the instances through their
        actors, by pid), then the actors killed, then Ray left (a local one shut down)."""
        if self.scaling is not None:
            await self.scaling.close()  # no instance is added or removed from now on
        await super().stop()
        await self._disconnect()

    async def _disconnect(self) -> None:
        if self._connected:
            for actor in self._actors.values():
                try:
                    ray.kill(actor, no_restart=True)
                except Exception as exc:  # already gone
                    log.debug("ray.kill: %s", exc)
            self._actors.clear()
            self._secret_refs.clear()
            ray.shutdown()  # on the thread that runs the launcher: from another one, a local Ray's shutdown aborts
            self._connected = False
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


async def _placed(actor) -> str:
    """The node `actor` runs on, once it runs: one whose node was lost answers
    ActorUnavailableError until Ray has declared the node dead and placed the actor again
    (the caller bounds the wait)."""
    while True:
        try:
            return await asyncio.wrap_future(actor.node.remote().future())
        except ray.exceptions.ActorUnavailableError:
            await asyncio.sleep(UNAVAILABLE_RETRY_S)  # a backoff between tries, not a wait for an event


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _text(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"
