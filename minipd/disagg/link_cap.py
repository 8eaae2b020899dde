"""An instance's half of a runtime KV link cap (`SetLinkCap`, the router's half is
ops/control_loop/link_cap.py): the transport's egress token bucket (`--link-gbps` at start) takes the
new rate from its next write on, on every backend alike (transports/base.py)."""

from __future__ import annotations

import logging

from minipd.control.link_caps import runtime_cap_error
from minipd.control.messages import CallError, LinkCapSet
from minipd.transports.base import Transport

log = logging.getLogger(__name__)


def set_link_cap(transport: Transport, gbps: float | None) -> LinkCapSet | CallError:
    """Apply the cap (None or 0: uncapped) and answer `LinkCapSet`, or a CallError "invalid"
    naming `gbps` for a rate outside the runtime range (control/link_caps.py; the cap
    is then unchanged)."""
    previous = transport.link_gbps
    error = runtime_cap_error(gbps or None)
    if error is not None:
        return CallError(message=f"gbps: {error}", kind="invalid")
    transport.set_link_gbps(gbps)
    log.warning(
        "%s: outgoing KV link %s (was %s)",
        transport.instance_id,
        f"capped at {gbps:g} Gbit/s" if gbps else "uncapped",
        f"{previous:g} Gbit/s" if previous else "uncapped",
    )
    return LinkCapSet(gbps=transport.link_gbps, previous_gbps=previous)
