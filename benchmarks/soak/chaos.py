"""Chaos for a process cluster: every interval one fault, the kinds in turn, and nothing
done by hand to recover from it: the cluster heals itself or the fault counts as unrecovered.

- `router-pause`: the router is stopped (SIGSTOP) for the liveness bound plus `PAUSE_MARGIN_S`,
  so every instance drops it and, on SIGCONT, it finds every instance lost; membership heals
  by itself (instances register again, the router redials them).
- `instance-pause`: one instance is stopped until the router declared it lost (`dropped`),
  and `PAUSE_MARGIN_S` more, then SIGCONT; the router readmits it by itself.
- `kill`: one instance is killed (kill -9); the launcher's `Supervisor`, running beside the
  soak as it runs in `minipd --role cluster`, restarts it after its backoff.

No fault calls `rejoin` or `restart`. After each, `recovery_s` is the time from the end of
the fault (the SIGCONT, the kill) until the cluster served at full capacity again, as
benchmarks/soak/recovery.py defines it; a fault not recovered from within `RECOVERY_BOUND_S`
has `recovery_s` None and the reason in `error`.

An instance is faulted only while another instance of its role is healthy, so that the
cluster can always serve: the soak measures what happens to requests caught by a fault, not
a cluster with no decode instance left.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time
from typing import NamedTuple

from benchmarks.soak import recovery
from minipd.control.role import Role
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.router.cluster_client import ClusterClient

log = logging.getLogger(__name__)

KINDS = ("router-pause", "instance-pause", "kill")
PAUSE_MARGIN_S = 1.5  # beyond the liveness bound: a pause the other side must notice
RECOVERY_BOUND_S = 60.0  # a restart imports torch and loads the model on a busy machine
DROP_WAIT_S = 10.0  # past the liveness bound, the longest an instance pause waits for the router to drop it


class ChaosEvent(NamedTuple):
    at_s: float  # when the fault began, since the chaos started
    kind: str  # one of KINDS
    target: str
    fault_s: float  # how long the pause lasted (0 for a kill)
    dropped: bool | None  # an instance pause: the router declared it lost meanwhile (None: not observable)
    recovery_s: float | None  # end of the fault -> full capacity again; None: not within the bound
    error: str | None  # why recovery_s is None


class Chaos:
    def __init__(self, cluster: ProcessCluster, client: ClusterClient, liveness_s: float, interval_s: float, seed: int):
        self.cluster, self.client = cluster, client
        self.liveness_s, self.interval_s = liveness_s, interval_s
        self.rng = random.Random(seed)
        self.events: list[ChaosEvent] = []

    async def run(self, stop: asyncio.Event) -> None:
        """Fault, one at a time, kinds in turn, until `stop` is set and every kind ran at least
        once; returns once the last fault was recovered from (or given up on)."""
        start = time.monotonic()
        for index in range(1 << 30):
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)  # the pause between faults
                if {e.kind for e in self.events} >= set(KINDS):
                    return
            except TimeoutError:
                pass
            kind = KINDS[index % len(KINDS)]
            target = "router" if kind == "router-pause" else self._pick()
            if target is None:
                continue
            began = time.monotonic()
            event = await getattr(self, "_" + kind.replace("-", "_"))(target)
            self.events.append(event._replace(at_s=round(began - start, 2)))
            log.warning("chaos: %s", self.events[-1])

    def _pick(self) -> str | None:
        instances = [c for c in self.cluster.children if c.role is not Role.ROUTER and c.process.returncode is None]
        by_role: dict[Role, list[str]] = {}
        for child in instances:
            by_role.setdefault(child.role, []).append(child.name)
        candidates = [name for names in by_role.values() if len(names) > 1 for name in names]
        return self.rng.choice(candidates) if candidates else None

    async def _router_pause(self, name: str) -> ChaosEvent:
        pause_s = self.liveness_s + PAUSE_MARGIN_S
        pid = self.cluster.child(name).process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(pause_s)  # the freeze itself: the router cannot be asked anything meanwhile
        finally:
            os.kill(pid, signal.SIGCONT)
        return await self._recovered("router-pause", name, pause_s, None)

    async def _instance_pause(self, name: str) -> ChaosEvent:
        pid = self.cluster.child(name).process.pid
        began = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        dropped = False
        try:
            # past the liveness bound: until the router declared it lost, then the margin
            while time.monotonic() - began < self.liveness_s + DROP_WAIT_S:
                names = await recovery.listed(self.client, self.liveness_s)
                if names is not None and name not in names:
                    dropped = True
                    break
                await asyncio.sleep(recovery.POLL_S)  # condition poll, bounded by the loop's clock
            await asyncio.sleep(max(0.0, began + self.liveness_s + PAUSE_MARGIN_S - time.monotonic()))
        finally:
            os.kill(pid, signal.SIGCONT)
        return await self._recovered("instance-pause", name, time.monotonic() - began, dropped)

    async def _kill(self, name: str) -> ChaosEvent:
        pid = self.cluster.child(name).process.pid
        os.kill(pid, signal.SIGKILL)
        return await self._recovered("kill", name, 0.0, None, replaced={name: pid})

    async def _recovered(self, kind, name, fault_s, dropped, replaced=None) -> ChaosEvent:
        ended = time.monotonic()
        try:
            recovery_s = await recovery.full_capacity_after_s(
                self.cluster, self.client, ended, RECOVERY_BOUND_S, replaced
            )
            return ChaosEvent(0.0, kind, name, round(fault_s, 2), dropped, round(recovery_s, 2), None)
        except recovery.NotRecovered as exc:
            return ChaosEvent(0.0, kind, name, round(fault_s, 2), dropped, None, str(exc))
