"""The Ray actor that runs one instance of a `--launcher ray` cluster (ray_cluster.py).

`InstanceSupervisor` is a plain class; the launcher makes it a Ray actor with the instance's
resources. `start` runs `minipd --role ROLE ARGV` as a process of its own on the actor's node
(the same spawn as the local launcher's, `process_cluster.spawn_process`), bound to the node's
address (`on_node`), and returns its address, pid and placement; `wait` returns once that
process exits (its exit status); `signal` sends it a signal by pid; `start` again replaces it
with a fresh one (the launcher's supervisor restarts an instance that died this way).

The secrets reach the process without passing through Ray's metadata: the launcher `ray.put`s
the child's secret environment variables and hands `start` the object's reference inside a
list (so only the reference is in the task's spec, never the value); the actor fetches it
and puts it in the child's environment, as the local launcher does. A Ray object is used, not
a file, because it reaches every node with no shared filesystem.

CPU placement follows what Ray assigned the actor: the child runs `--torch-threads` for the
CPUs Ray gave it, and `--cpus` pinned to the cores the launcher planned when the actor runs on
the launcher's own node (the plan is disjoint there), or to the process affinity Ray gave the
actor when that is narrower than the node; elsewhere its cores float. The child inherits the
read end of the actor's `LauncherPipe`, so it stops by itself if the actor dies, however.
"""

from __future__ import annotations

import asyncio
import os
import signal

import ray

from minipd.control.role import Role
from minipd.engine.cpu_placement import cpus_text, default_torch_threads
from minipd.entrypoints.child_spawn import spawn_process
from minipd.entrypoints.launcher_pipe import LauncherPipe
from minipd.entrypoints.openmp_env import passive_env

HOST_FLAG = "--host"


def on_node(argv: list[str], node_ip: str) -> list[str]:
    """`argv` binding the instance to `node_ip`, the address Ray knows its node by, in place of
    the launcher's `--host`: the router (on the launcher's host) and the other instances (on
    theirs) reach it there, and the KV transports advertise the address they bind, so neither a
    loopback nor a wildcard address would do on a node of its own."""
    argv = list(argv)
    if HOST_FLAG in argv:
        last = len(argv) - 1 - argv[::-1].index(HOST_FLAG)
        argv[last + 1] = node_ip
        return argv
    return [*argv, HOST_FLAG, node_ip]


class InstanceSupervisor:
    """One instance's process on the node Ray placed this actor on."""

    def __init__(self, name: str, role: str) -> None:
        self.name, self.role = name, Role(role)
        self._pipe = LauncherPipe()
        self._process: asyncio.subprocess.Process | None = None
        self._exits: dict[int, asyncio.Future] = {}  # pid -> its exit status, once it exited

    def node(self) -> str:
        """The id of the node Ray placed this actor on (an answer means it was placed)."""
        return ray.get_runtime_context().get_node_id()

    async def start(
        self,
        argv: list[str],
        secret_env: list,
        planned_cpus: list[int] | None,
        launcher_node: str,
        placed: bool,
        torch_threads: int | None = None,
    ) -> dict:
        """Start the instance (a running one is killed first); `secret_env` is `[ObjectRef]` of
        the secret variables (None: unset); `placed`: CPU placement is on (`torch_threads`: the
        user's own count). Returns its address, pids, node and placement."""
        await self._end_current()
        env = dict(os.environ)
        for variable, value in (await secret_env[0]).items():
            if value is None:
                env.pop(variable, None)
            else:
                env[variable] = value
        argv, where = on_node(argv, ray.util.get_node_ip_address()), "not pinned"
        if placed:
            passive_env(env)
            cpus, threads = self._placement(planned_cpus, launcher_node)
            threads = torch_threads or threads
            argv += ["--torch-threads", str(threads)] + (["--cpus", ",".join(map(str, cpus))] if cpus else [])
            where = f"{threads} torch thread{'s' if threads != 1 else ''} on " + (
                cpus_text(tuple(cpus)) if cpus else "cores not pinned"
            )
        env.update(self._pipe.child_env())
        process, (host, port), announcements, stderr = await spawn_process(
            self.name, self.role, argv, env, self._pipe.pass_fds
        )
        stderr.release()  # to the actor's stderr, which Ray forwards to the launcher's
        self._process = process
        exited = asyncio.get_running_loop().create_future()
        self._exits[process.pid] = exited
        asyncio.get_running_loop().create_task(self._watch(process, exited))
        context = ray.get_runtime_context()
        return {
            "host": host,
            "port": port,
            "pid": process.pid,
            "actor_pid": os.getpid(),
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "assigned": context.get_assigned_resources(),
            "placement": where,
            "announcements": announcements,
        }

    def _placement(self, planned: list[int] | None, launcher_node: str) -> tuple[list[int] | None, int]:
        assigned = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        count = max(1, int(assigned))
        affinity = sorted(os.sched_getaffinity(0))
        if planned and ray.get_runtime_context().get_node_id() == launcher_node and set(planned) <= set(affinity):
            return planned, default_torch_threads(len(planned))
        if len(affinity) < (os.cpu_count() or len(affinity)):  # Ray (or its node's limits) narrowed it
            cores = affinity[:count]
            return cores, default_torch_threads(len(cores))
        return None, default_torch_threads(count)

    @staticmethod
    async def _watch(process: asyncio.subprocess.Process, exited: asyncio.Future) -> None:
        exited.set_result(await process.wait())

    async def wait(self, pid: int) -> int:
        """The exit status of the process `pid` this actor started, once it exited."""
        return await asyncio.shield(self._exits[pid])

    def signal(self, pid: int, signum: int) -> bool:
        """Send `signum` to the process `pid` this actor started, if it still runs."""
        exited = self._exits.get(pid)
        if exited is None or exited.done():
            return False
        try:
            os.kill(pid, signal.SIGCONT)  # one stopped at a fault point must hear it
            os.kill(pid, signum)
        except ProcessLookupError:
            return False
        return True

    async def _end_current(self) -> None:
        process = self._process
        if process is not None and process.returncode is None:
            try:
                process.kill()
            except ProcessLookupError:
                pass
            await process.wait()
