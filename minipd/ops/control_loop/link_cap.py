"""The router's half of a runtime KV link cap ("starve the link"; the instance's half is
disagg/link_cap.py): `set_link_cap(registry, instance_id, gbps)` checks the request, sends
`SetLinkCap` over the instance's authenticated control connection and answers what the
instance now enforces. The cap is on the instance's egress, so it slows the KV that a
prefill (or colocated instance prefilling for another) sends; the next request's transfer
feels it, transfers already waiting for the link keep their pace."""

from __future__ import annotations

import math

import msgspec

from minipd.control.channel import ChannelClosed, RemoteError
from minipd.control.messages import LinkCapSet, SetLinkCap
from minipd.engine.sampling_params import InvalidRequestError
from minipd.router.registry import InstanceRegistry
from minipd.router.role_switch_driver import UnknownInstance


class LinkCapFailed(RuntimeError):
    """The instance did not take the cap (it refused, or was lost); its cap is as before if alive."""


class LinkCapReport(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    role: str
    gbps: float | None  # the cap in force now; None: uncapped
    previous_gbps: float | None


def check_gbps(gbps: float | None) -> None:
    """None (uncapped) or a positive, finite rate; InvalidRequestError naming `gbps` otherwise."""
    if gbps is None:
        return
    if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not (gbps > 0 and math.isfinite(gbps)):
        raise InvalidRequestError("gbps", f"must be a positive number of Gbit/s, or null to lift the cap; got {gbps}")


async def set_link_cap(
    registry: InstanceRegistry, instance_id: str, gbps: float | None, timeout_s: float
) -> LinkCapReport:
    """Raises UnknownInstance, InvalidRequestError (`gbps`), or LinkCapFailed."""
    handle = registry.instances.get(instance_id)
    if handle is None or not handle.is_alive:
        raise UnknownInstance(instance_id, sorted(h.instance_id for h in registry.alive()))
    check_gbps(gbps)
    try:
        reply: LinkCapSet = await handle.channel.call(SetLinkCap(gbps=None if gbps is None else float(gbps)), timeout_s)
    except (RemoteError, ChannelClosed, TimeoutError) as exc:
        raise LinkCapFailed(f"{instance_id} did not take the link cap: {exc}") from exc
    return LinkCapReport(
        instance=instance_id, role=handle.role.value, gbps=reply.gbps, previous_gbps=reply.previous_gbps
    )
