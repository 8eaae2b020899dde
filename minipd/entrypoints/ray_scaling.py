"""Pool scaling for `minipd --role cluster --launcher ray`: the launcher's end of the router's
scale link (ops/control_loop/scale_link.py, the calls; ops/control_loop/pool_scaler.py, who makes them and when).

With a pool scaling flag (`--min-prefill`, `--max-prefill`, `--min-decode`, `--max-decode`,
`--scale-idle-window-s`, `--scale-cooldown-s`; `ClusterConfig.scaling`), `RayCluster` keeps a
`RayPoolScaling`: every instance the pools may grow to has a slot, named as the launcher names
instances (`decode-0` .. `decode-{max-1}`), whose CPU share is planned with the others at start
(and a local Ray started for the run gets the CPUs of every slot). Each router the launcher
starts inherits one end of a fresh socket pair; this module serves the other, one call at a
time:
- `hello`: the scaling config;
- `room`: per role, whether one more instance fits: the scaled instances stay within the
  bounds' total (the router keeps each pool's own bounds: it sees the roles instances
  switched to) and an alive Ray node has the resources one more instance of it asks for free
  now (`ray._private.state`'s per-node available resources: what the GCS last heard, so it
  can lag a placement by a moment; a placement that then finds no room fails the add within
  `PLACEMENT_TIMEOUT_S`, naming them);
- `add` `role`: the first free slot of the role is started as at launch (a Ray actor placed by
  its resources, its process, registered with the router) and supervised like the others;
- `remove` `instance`: the instance leaves the supervised children, its process is stopped as
  at shutdown (SIGTERM: its own graceful drain), and its actor is killed.
Without the Ray launcher there is no scaling: a scaling flag is refused at the command line.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

from ray._private import state as ray_state  # per-node available resources (a developer API)

from minipd.control.role import Role
from minipd.ops.control_loop.scale_link import MAX_LINE_BYTES, ScaleCall, ScaleReply, read_call, write_reply
from minipd.policy.pool_scaling import ScalingConfig

log = logging.getLogger(__name__)

SCALED_ROLES = (Role.PREFILL, Role.DECODE)


class RayPoolScaling:
    def __init__(self, cluster, config: ScalingConfig):  # cluster: the RayCluster it scales
        self.cluster, self.config = cluster, config
        self._serving: set[asyncio.Task] = set()

    def slot_names(self) -> list[tuple[str, Role]]:
        """Every instance the cluster may run, scaled pools at their maximum, in launch order."""
        cluster = self.cluster.configs.cluster
        bounds = self.config.bounds
        return (
            [(f"prefill-{i}", Role.PREFILL) for i in range(max(bounds.max_prefill, cluster.num_prefill))]
            + [(f"decode-{i}", Role.DECODE) for i in range(max(bounds.max_decode, cluster.num_decode))]
            + [(f"colocated-{i}", Role.BOTH) for i in range(cluster.num_colocated)]
        )

    def describe(self) -> str:
        b, c = self.config.bounds, self.config
        return (
            f"scaling: prefill {b.min_prefill}..{b.max_prefill}, decode {b.min_decode}..{b.max_decode} instances "
            f"(while the ratio controller is on), idle window {c.idle_window_s:g} s, cool-down {c.cooldown_s:g} s"
        )

    # ---- the link --------------------------------------------------------------------------
    def router_socket(self) -> socket.socket:
        """The end of a fresh link for a router about to start (the caller passes it on and
        closes it once the router started); this end is served until the router closes its."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        task = asyncio.get_running_loop().create_task(self._serve(ours))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)
        return theirs

    async def _serve(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_LINE_BYTES)
        try:
            while True:
                try:
                    call = await read_call(reader)
                except Exception as exc:  # an over-long or malformed line: the link is not trusted further
                    log.warning("scale link: closing it: %s", exc)
                    return
                if call is None:
                    return
                write_reply(writer, await self._answer(call))
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()

    async def _answer(self, call: ScaleCall) -> ScaleReply:
        try:
            if call.op == "hello":
                return ScaleReply(id=call.id, config=self.config)
            if call.op == "room":
                return ScaleReply(id=call.id, room={role.value: self.room(role) for role in SCALED_ROLES})
            if call.op == "add":
                name, address = await self.add(_role(call.role))
                return ScaleReply(id=call.id, instance=name, address=address)
            await self.remove(call.instance or "")
            return ScaleReply(id=call.id)
        except (RuntimeError, ValueError) as exc:
            return ScaleReply(id=call.id, error=str(exc))

    # ---- the calls ---------------------------------------------------------------------------
    # The router counts the pools by the roles its instances serve now (one may have switched
    # since it started); the launcher knows only the role each started with. So the bounds per
    # role are the router's to keep, and the launcher keeps their sum: it never runs more scaled
    # instances than the largest prefill and decode pools together.
    def _scaled(self) -> list[str]:
        return [c.name for c in self.cluster.children if c.role in SCALED_ROLES]

    def _at_most(self) -> int:
        return self.config.bounds.max_prefill + self.config.bounds.max_decode

    def _free_slot(self, role: Role) -> str:
        """The first slot of `role` no instance runs in; past the planned slots (instances that
        switched roles hold theirs), a new one sharing the first slot's placement."""
        taken = {c.name for c in self.cluster.children}
        slots = [name for name, r in self.slot_names() if r is role]
        free = next((name for name in slots if name not in taken), None)
        if free is None:
            free = next(f"{role.value}-{i}" for i in range(len(slots), len(slots) + len(taken) + 1)
                        if f"{role.value}-{i}" not in taken)  # fmt: skip
            self.cluster.placement[free] = self.cluster.placement[slots[0]]
        return free

    def room(self, role: Role) -> bool:
        """Whether one more instance of `role` fits: below the scaled instances' total bound,
        and an alive node has the resources it asks for free now."""
        if len(self._scaled()) >= self._at_most():
            return False
        wanted = self.cluster._resources(self._free_slot(role), role)
        nodes = ray_state.available_resources_per_node().values()
        return any(all(free.get(k, 0.0) >= v for k, v in wanted.items()) for free in nodes)

    async def add(self, role: Role) -> tuple[str, str]:
        """Start one more instance of `role` in its first free slot; (its name, HOST:PORT)."""
        if len(self._scaled()) >= self._at_most():
            raise RuntimeError(f"role: {self._at_most()} prefill and decode instances run, the most the bounds allow")
        name = self._free_slot(role)
        _say(f"adding {name} (the ratio controller wants another {role.value} instance)")
        child = await self.cluster.add_instance(name, role)
        host, port = child.address
        for line in self.cluster.ready_lines():  # where Ray placed it, before it is said to be added
            if line.startswith(f"ray: {name} "):
                print(line, flush=True)
        _say(f"added {name} (pid {child.process.pid}) at {host}:{port}")
        return name, f"{host}:{port}"

    async def remove(self, name: str) -> None:
        """Stop instance `name` for good (the router drained it)."""
        if name not in self._scaled():
            raise ValueError(f"instance: no scaled instance {name!r} runs")
        _say(f"removing {name} (its pool was idle)")
        await self.cluster.remove_instance(name)
        _say(f"removed {name}")

    async def close(self) -> None:
        """Stop serving every link (a call under way is abandoned)."""
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)


def _role(text: str | None) -> Role:
    for role in SCALED_ROLES:
        if text == role.value:
            return role
    raise ValueError(f"role: expected prefill or decode, got {text!r}")


def _say(line: str) -> None:
    print(f"minipd cluster: {line}", file=sys.stderr, flush=True)
