"""How the local cluster launcher divides the host's cores among its processes.

Instances are CPU-bound while they run a step; the router (and its HTTP front) mostly waits
on sockets but must answer at once. So, with `n` cores for `k` instances:

- `n > k`: the router gets the last core to itself; the instances split the other `n - 1`
  into contiguous runs as even as possible (the first ones listed, the prefill instances,
  get the cores left over: prefill is the compute-bound phase).
- `n <= k`: instance i gets core `i mod n` (sharing only when there are more instances than
  cores) and the router may run on every core: it sleeps on I/O, and with passive OpenMP
  (see openmp_env.py) no idle instance thread spins against it.

Each instance runs `default_torch_threads(its cores)` torch threads unless `--torch-threads`
says otherwise: on one core, one thread; on more, one core is left to its own event loop
(token streaming, KV sends). With `--no-cpu-placement` nothing is divided: every child gets
`--cpus` and `--torch-threads` exactly as given (if at all).
"""

from __future__ import annotations

from typing import NamedTuple

from minipd.engine.cpu_placement import available_cpus, cpus_text, default_torch_threads

ROUTER = "router"


class ChildPlacement(NamedTuple):
    cpus: tuple[int, ...] | None  # None: not pinned
    torch_threads: int | None  # None: the child's own default (the router runs no model)

    def describe(self) -> str:
        where = "not pinned" if self.cpus is None else cpus_text(self.cpus)
        if self.torch_threads is None:
            return where
        return f"{self.torch_threads} torch thread{'s' if self.torch_threads != 1 else ''} on {where}"


def plan_cluster(
    instances: list[str], cpus: tuple[int, ...] | None = None, torch_threads: int | None = None, enabled: bool = True
) -> dict[str, ChildPlacement]:
    """Each instance's placement and the router's (under `ROUTER`), in the order given."""
    if not enabled:
        return {name: ChildPlacement(cpus, torch_threads) for name in instances} | {ROUTER: ChildPlacement(cpus, None)}
    cores = cpus if cpus is not None else available_cpus()
    n, k = len(cores), len(instances)
    if n > k:
        shares = _split(cores[:-1], k)
        router = cores[-1:]
    else:
        shares = [(cores[i % n],) for i in range(k)]
        router = cores
    plan = {
        name: ChildPlacement(share, torch_threads or default_torch_threads(len(share)))
        for name, share in zip(instances, shares)
    }
    plan[ROUTER] = ChildPlacement(router, None)
    return plan


def _split(cores: tuple[int, ...], parts: int) -> list[tuple[int, ...]]:
    """`cores` in `parts` contiguous runs whose sizes differ by at most one, larger first."""
    base, extra = divmod(len(cores), parts)
    runs, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        runs.append(cores[start : start + size])
        start += size
    return runs
