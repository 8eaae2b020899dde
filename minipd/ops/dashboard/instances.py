"""The dashboard's instance rows: what each instance is, how alive, how full, how busy.

A row (a dict, JSON as it goes) has `instance`, `role`, `epoch`, `liveness`, `compute`,
`blocks` (`total`, `used`, `cached`, `free`, `fencing`), `reservations`, `running`, `waiting`,
`prefilling`, `inflight` (routed by the router and not finished), `step_rate` (engine steps
per second between the two latest reports; None until there are two) and `kv_tier` (its
`KVTierReport` as a dict; None without a tier, or before its first report).

Liveness, from the router's view: `dead` (its connection is gone, or it was declared dead and
evicted), `draining` (switching roles or shutting down: it takes no new work), `stale` (its
stats did not arrive in time lately), else `alive`. The registry forgets a lost instance, so
`RouterInstances` keeps showing it as `dead` for `dead_kept_s` (unless it registers again).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from minipd.control.role import Role
from minipd.engine import cpu_placement

if TYPE_CHECKING:
    from minipd.engine.engine import Engine
    from minipd.router.registry import InstanceHandle
    from minipd.router.router import Router

DEAD_KEPT_S = 60.0
ALIVE, STALE, DEAD, DRAINING = "alive", "stale", "dead", "draining"
POOLS = {Role.PREFILL: "prefill", Role.DECODE: "decode", Role.BOTH: "colocated"}


class StepRate:
    """Steps per second of each instance, from its successive (steps, reported at) pairs."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, float, float | None]] = {}  # id -> (steps, at, rate)

    def update(self, instance_id: str, num_steps: int, at: float) -> float | None:
        previous = self._last.get(instance_id)
        rate = None
        if previous is not None:
            steps, then, rate = previous
            if at > then and num_steps >= steps:
                rate = (num_steps - steps) / (at - then)
            elif at == then:
                return rate  # no new report: the rate stands
        self._last[instance_id] = (num_steps, at, rate)
        return rate

    def forget(self, keep: set[str]) -> None:
        for instance_id in set(self._last) - keep:
            del self._last[instance_id]


def _row(instance_id: str, role: Role, epoch: int, liveness: str, compute: str) -> dict:
    return {
        "instance": instance_id,
        "role": role.value,
        "pool": POOLS.get(role, role.value),
        "epoch": epoch,
        "liveness": liveness,
        "compute": compute,
        "blocks": {"total": 0, "used": 0, "cached": 0, "free": 0, "fencing": 0},
        "reservations": 0,
        "running": 0,
        "waiting": 0,
        "prefilling": 0,
        "inflight": 0,
        "step_rate": None,
        "kv_tier": None,
    }


def liveness(handle: InstanceHandle) -> str:
    if not handle.is_alive or handle.evicted:
        return DEAD
    if handle.draining or (handle.stats is not None and handle.stats.switching):
        return DRAINING
    return STALE if handle.is_stale else ALIVE


class RouterInstances:
    """Rows of a router's instances (its registry), the recently lost ones as `dead`."""

    def __init__(self, router: Router, dead_kept_s: float = DEAD_KEPT_S):
        self.router, self.dead_kept_s = router, dead_kept_s
        self.steps = StepRate()
        self._gone: dict[str, tuple[float, dict]] = {}  # id -> (when it disappeared, its last row)
        self._last_rows: dict[str, dict] = {}

    def rows(self) -> list[dict]:
        now = time.monotonic()
        rows = [self._handle_row(h) for h in list(self.router.registry.instances.values())]
        current = {r["instance"] for r in rows}
        for instance_id, row in self._last_rows.items():
            if instance_id not in current and instance_id not in self._gone:
                self._gone[instance_id] = (now, {**row, "liveness": DEAD, "step_rate": None})
        for instance_id in list(self._gone):
            if instance_id in current or now - self._gone[instance_id][0] > self.dead_kept_s:
                del self._gone[instance_id]
        self._last_rows = {r["instance"]: r for r in rows}
        self.steps.forget(current)
        return sorted(rows + [row for _, row in self._gone.values()], key=lambda r: r["instance"])

    def _handle_row(self, h: InstanceHandle) -> dict:
        row = _row(h.instance_id, h.role, h.epoch, liveness(h), h.welcome.compute)
        row["inflight"] = h.num_inflight
        s = h.stats
        if s is not None:
            row["blocks"] = {
                "total": s.num_blocks,
                "used": s.num_used_blocks,
                "cached": s.num_cached_blocks,
                "free": s.num_free_blocks,
                "fencing": s.num_fencing_blocks,
            }
            row.update(
                reservations=s.num_reservations,
                running=s.num_running,
                waiting=s.num_waiting,
                prefilling=s.num_prefilling,
                step_rate=self.steps.update(h.instance_id, s.num_steps, h.stats_at),
                kv_tier=None if s.kv_tier is None else msgspec.to_builtins(s.kv_tier),
            )
        return row


class EngineInstances:
    """The one row of a colocated engine (`--role both --port`), read from the engine itself."""

    def __init__(self, engine: Engine, name: str = "local"):
        self.engine, self.name = engine, name
        self.compute = cpu_placement.compute_key(engine.config.device, engine.placement)
        self.steps = StepRate()

    def rows(self) -> list[dict]:
        s = self.engine.stats()
        row = _row(self.name, Role.BOTH, 0, ALIVE if self.engine.is_running else DEAD, self.compute)
        row["blocks"] = {
            "total": s.blocks.num_blocks,
            "used": s.blocks.num_used,
            "cached": s.blocks.num_cached,
            "free": s.blocks.num_free,
            "fencing": 0,
        }
        row.update(
            running=s.num_running,
            waiting=s.num_waiting,
            prefilling=s.num_prefilling,
            step_rate=self.steps.update(self.name, self.engine.num_steps, time.monotonic()),
        )
        return [row]
