"""The range of a runtime KV link cap (`SetLinkCap`: `POST /admin/link_cap` on the router,
checked there and again by the instance), and why it is what it is.

- MIN_GBPS, 0.001 Gbit/s (1 Mbit/s, 125 kB/s), the slowest link worth emulating (the
  planner's bandwidth search stops there too, ops/planner/plan_view.py): every KV write
  still ends in bounded time, one layer of a 2048-token `tiny` prompt (1 MiB) in about 8 s,
  well within the decode instance's lease (30 s), which each layer sent renews. Below it a
  write is booked absurdly far ahead: a request under a cap of 1e-300 Gbit/s took ~45 s;
- MAX_GBPS, 10,000 Gbit/s, beyond any link (NVLink's 2400 Gbit/s included): null lifts a
  cap, a higher rate means nothing more.
The `--link-gbps` flag, set at start, is not held to this range.
"""

from __future__ import annotations

MIN_GBPS, MAX_GBPS = 0.001, 10_000.0


def runtime_cap_error(gbps: object) -> str | None:
    """Why `gbps` cannot be a runtime link cap (None: it can, null included: no cap)."""
    if gbps is None:
        return None
    if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not (MIN_GBPS <= gbps <= MAX_GBPS):
        return (
            f"must be a positive number of Gbit/s from {MIN_GBPS:g} to {MAX_GBPS:g}, or null to lift the cap; "
            f"got {gbps!r}"
        )
    return None
