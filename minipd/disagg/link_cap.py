"""An instance's half of a runtime KV link cap (`SetLinkCap`, the router's half is
ops/control_loop/link_cap.py): the transport's egress token bucket (`--link-gbps` at start) takes the
new rate from its next write on, on every backend alike (transports/base.py)."""

from __future__ import annotations

import logging

from minipd.control.messages import CallError, LinkCapSet
from minipd.transports.base import Transport

log = logging.getLogger(__name__)


def set_link_cap(transport: Transport, gbps: float | None) -> LinkCapSet | CallError:
    """Apply the cap (None: uncapped) and answer `LinkCapSet`, or a CallError "invalid" naming
    `gbps` for a rate that is not positive and finite (the cap is then unchanged)."""
    previous = transport.link_gbps
    try:
        transport.set_link_gbps(gbps)
    except ValueError as exc:
        return CallError(message=f"gbps: {exc}", kind="invalid")
    log.warning(
        "%s: outgoing KV link %s (was %s)",
        transport.instance_id,
        f"capped at {gbps:g} Gbit/s" if gbps else "uncapped",
        f"{previous:g} Gbit/s" if previous else "uncapped",
    )
    return LinkCapSet(gbps=transport.link_gbps, previous_gbps=previous)
