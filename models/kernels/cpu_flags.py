"""The CPU's feature flags as Linux reports them (`/proc/cpuinfo`), for choosing dtypes and kernels."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def read_cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The CPU feature flags of the first processor in `cpuinfo`, or None when unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return None
