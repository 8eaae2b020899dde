"""Where splitting stops paying: the best split against all-colocated, over cluster sizes and
link bandwidths.

For each size N the colocated goodput (best chunk budget) is compared with the best P:D
split's, per instance. `colocated_wins_below` is, per link bandwidth, the smallest swept size
from which some split beats colocated at that size and every larger one swept: below it
colocated chunked prefill is the better answer. None means no split won at the largest size.
At N = 1 there is no split, so colocated wins there by definition.

Up to `EXHAUSTIVE_UP_TO` instances every split is tried; above, the best number of prefill
instances is found by an integer ternary search, which assumes goodput is unimodal in P
(it rises while prefill is the bottleneck and falls once decode is).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from minipd.ops.planner.cluster_spec import ClusterSpec
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.planner import PlanConfig, best_goodput

EXHAUSTIVE_UP_TO = 8


class SizePoint(msgspec.Struct, frozen=True):
    num_instances: int
    link_gbps: float | None  # None: unlimited
    colocated_per_instance: float
    best_split: str | None  # None at one instance
    best_split_per_instance: float
    splitting_pays: bool


class SizeSweep(msgspec.Struct, frozen=True):
    sizes: list[int]
    link_gbps: list[float | None]
    points: list[SizePoint]
    colocated_wins_below: dict[str, int | None]  # link label -> size; see the module docstring


def link_label(gbps: float | None) -> str:
    return "unlimited" if gbps is None else f"{gbps:g} Gbit/s"


def _best_split(config: PlanConfig, n: int) -> tuple[str | None, float]:
    memo: dict[int, float] = {}

    def goodput(p: int) -> float:
        if p not in memo:
            memo[p] = best_goodput(config, ClusterSpec.split(p, n - p))[2]
        return memo[p]

    if n < 2:
        return None, 0.0
    if n <= EXHAUSTIVE_UP_TO:
        candidates = range(1, n)
    else:
        lo, hi = 1, n - 1
        while hi - lo > 2:
            m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
            if goodput(m1) < goodput(m2):
                lo = m1 + 1
            elif goodput(m1) > goodput(m2):
                hi = m2 - 1
            else:  # a tie: the peak lies between them
                lo, hi = m1, m2
        candidates = range(lo, hi + 1)
    best = max(candidates, key=goodput)
    return ClusterSpec.split(best, n - best).label, goodput(best)


def sweep_sizes(config: PlanConfig, sizes: Sequence[int], links: Sequence[KVLink]) -> SizeSweep:
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sweep sizes: need sizes >= 1, got {list(sizes)}")
    colocated = {n: best_goodput(config, ClusterSpec.colocated(n))[2] / n for n in sizes}
    points, crossover = [], {}
    for link in links:
        gbps = None if link.gbps == float("inf") else link.gbps
        linked = msgspec.structs.replace(config, link=link)
        row = []
        for n in sizes:
            label, goodput = _best_split(linked, n)
            per_instance = goodput / n
            row.append(SizePoint(n, gbps, colocated[n], label, per_instance, per_instance > colocated[n]))
        points.extend(row)
        wins_from = None
        for point in reversed(row):
            if not point.splitting_pays:
                break
            wins_from = point.num_instances
        crossover[link_label(gbps)] = wins_from
    return SizeSweep(
        sizes=list(sizes),
        link_gbps=[None if lk.gbps == float("inf") else lk.gbps for lk in links],
        points=points,
        colocated_wins_below=crossover,
    )
