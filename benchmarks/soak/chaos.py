"""Chaos for a process cluster: every interval, one instance is killed (kill -9, then restarted)
or frozen (SIGSTOP past the liveness bound, then SIGCONT and registered again).

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

from minipd.control.channel import RemoteError
from minipd.control.role import Role
from minipd.entrypoints.process_cluster import ProcessCluster

log = logging.getLogger(__name__)

KINDS = ("kill", "freeze")


class ChaosEvent(NamedTuple):
    at_s: float  # since the chaos started
    kind: str  # "kill" or "freeze"
    target: str
    recovered_s: float  # how long until it served again (restarted, or resumed and registered)


class Chaos:
    def __init__(self, cluster: ProcessCluster, interval_s: float, freeze_s: float, seed: int) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.freeze_s = freeze_s
        self.rng = random.Random(seed)
        self.events: list[ChaosEvent] = []

    async def run(self, stop: asyncio.Event) -> None:
        """Fault instances, one at a time, kinds in turn, until `stop` is set; returns once the
        last faulted instance has recovered."""
        start = time.monotonic()
        for index in range(1 << 30):
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)  # the pause between faults
                return
            except TimeoutError:
                pass
            target = self._pick()
            if target is None:
                continue
            kind = KINDS[index % len(KINDS)]
            at_s = time.monotonic() - start
            began = time.monotonic()
            await (self._kill(target) if kind == "kill" else self._freeze(target))
            self.events.append(ChaosEvent(round(at_s, 2), kind, target, round(time.monotonic() - began, 2)))
            log.warning("chaos: %s %s at %.1f s", kind, target, at_s)

    def _pick(self) -> str | None:
        instances = [c for c in self.cluster.children if c.role is not Role.ROUTER and c.process.returncode is None]
        by_role: dict[Role, list[str]] = {}
        for child in instances:
            by_role.setdefault(child.role, []).append(child.name)
        candidates = [name for names in by_role.values() if len(names) > 1 for name in names]
        return self.rng.choice(candidates) if candidates else None

    async def _kill(self, name: str) -> None:
        os.kill(self.cluster.child(name).process.pid, signal.SIGKILL)
        await self.cluster.restart(name)

    async def _freeze(self, name: str) -> None:
        pid = self.cluster.child(name).process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(self.freeze_s)  # the freeze itself
        finally:
            os.kill(pid, signal.SIGCONT)
        try:
            await self.cluster.rejoin(name)
        except RemoteError as exc:  # not declared dead after all: still registered
            log.info("chaos: %s was still registered after its freeze: %s", name, exc)
