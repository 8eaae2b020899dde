"""The soak's memory check: every cluster process's resident set (VmRSS) at the start and end.

`sample` reads /proc/<pid>/status of each child of a `ProcessCluster` (Linux); `report` pairs
the two samples by name. A child whose pid changed between them was killed and restarted: its
end figure belongs to a younger process, so it is reported (`restarted`) but not counted in
`rss_growth_mb`, the largest growth of a process that ran the whole soak. `checks_failed`
names a growth past the bound; bench.py then exits with status 1.

Why the default bound: a `tiny` instance settles within tens of MB of its start-up figure
once its first requests have run (buffers, allocator arenas, the kernels of a bounded set of
shapes); an engine whose per-shape kernel caches are unbounded grew by hundreds of MB over a
few hundred distinct prompt lengths (see minipd/engine/kernel_caches.py).
"""

from __future__ import annotations

from minipd.entrypoints.process_cluster import ProcessCluster

DEFAULT_MAX_GROWTH_MB = 150.0


def vm_rss_mb(pid: int) -> float | None:
    """The process's resident set in MB, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def sample(cluster: ProcessCluster) -> dict[str, tuple[int, float | None]]:
    """{child name: (pid, VmRSS MB)} of every child now."""
    return {c.name: (c.process.pid, vm_rss_mb(c.process.pid)) for c in cluster.children}


def report(start: dict, end: dict, max_growth_mb: float) -> dict:
    per_process = {}
    growths = []
    for name in sorted(start.keys() | end.keys()):
        pid_start, mb_start = start.get(name, (None, None))
        pid_end, mb_end = end.get(name, (None, None))
        restarted = pid_start != pid_end
        per_process[name] = {
            "start_mb": _round(mb_start),
            "end_mb": _round(mb_end),
            "restarted": restarted,
        }
        if not restarted and mb_start is not None and mb_end is not None:
            growths.append(mb_end - mb_start)
    growth = round(max(growths, default=0.0), 1)
    failed = []
    if growth > max_growth_mb:
        failed.append(f"rss grew {growth:.0f} MB in one process, more than --max-rss-growth-mb {max_growth_mb:g}")
    return {
        "rss_mb": per_process,
        "rss_growth_mb": growth,
        "rss_processes_checked": len(growths),
        "max_rss_growth_mb": max_growth_mb,
        "checks_failed": failed,
    }


def print_table(result: dict) -> None:
    print(f"{'process':>12} {'rss start MB':>13} {'rss end MB':>11}")
    for name, r in result["rss_mb"].items():
        note = "  (restarted: a new process)" if r["restarted"] else ""
        print(f"{name:>12} {_fmt(r['start_mb']):>13} {_fmt(r['end_mb']):>11}{note}")
    print(
        f"  largest growth of a process that ran throughout: {result['rss_growth_mb']:.0f} MB "
        f"(bound {result['max_rss_growth_mb']:g} MB)"
    )
    for check in result["checks_failed"]:
        print(f"  FAILED: {check}")


def _round(mb: float | None) -> float | None:
    return None if mb is None else round(mb, 1)


def _fmt(mb: float | None) -> str:
    return "-" if mb is None else f"{mb:.0f}"
