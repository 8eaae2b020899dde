"""The router's half of a runtime KV link cap ("starve the link"; the instance's half is
disagg/link_cap.py): `set_link_cap(registry, instance_id, gbps)` checks the request, sends
`SetLinkCap` over the instance's authenticated control connection and answers what the
instance now enforces. The cap is on the instance's egress, so it slows the KV that a
prefill (or colocated instance prefilling for another) sends; the next request's transfer
feels it, transfers already waiting for the link keep their pace.

A cap is a rate in [MIN_GBPS, MAX_GBPS] Gbit/s (0.001 to 10,000; control/link_caps.py
says why), or null to lift it; it is set only where a link exists, on an instance that sends
KV (prefill or both): a decode instance sends none (`LinkCapConflict`). Lifting is always
allowed (a cap set before the instance switched to decode can be lifted after)."""

from __future__ import annotations

import msgspec

from minipd.control.channel import ChannelClosed, RemoteError
from minipd.control.link_caps import runtime_cap_error
from minipd.control.messages import LinkCapSet, SetLinkCap
from minipd.engine.sampling_params import InvalidRequestError
from minipd.router.registry import InstanceRegistry
from minipd.router.role_switch_driver import UnknownInstance


class LinkCapConflict(RuntimeError):
    """The instance sends no KV in its role (decode): a cap there would cap nothing."""


class LinkCapFailed(RuntimeError):
    """The instance did not take the cap (it refused, or was lost); its cap is as before if alive."""


class LinkCapReport(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    role: str
    gbps: float | None  # the cap in force now; None: uncapped
    previous_gbps: float | None


def check_gbps(gbps: float | None) -> None:
    """None (uncapped) or a rate in the runtime range; InvalidRequestError naming `gbps` otherwise."""
    error = runtime_cap_error(gbps)
    if error is not None:
        raise InvalidRequestError("gbps", error)


async def set_link_cap(
    registry: InstanceRegistry, instance_id: str, gbps: float | None, timeout_s: float
) -> LinkCapReport:
    """Raises UnknownInstance, InvalidRequestError (`gbps`), LinkCapConflict or LinkCapFailed."""
    handle = registry.instances.get(instance_id)
    if handle is None or not handle.is_alive:
        raise UnknownInstance(instance_id, sorted(h.instance_id for h in registry.alive()))
    check_gbps(gbps)
    if gbps is not None and not handle.role.serves_prefill:
        raise LinkCapConflict(
            f"instance: {instance_id} is a {handle.role.value} instance, which sends no KV: a link cap goes on an "
            "instance that prefills (prefill or both)"
        )
    try:
        reply: LinkCapSet = await handle.channel.call(SetLinkCap(gbps=None if gbps is None else float(gbps)), timeout_s)
    except (RemoteError, ChannelClosed, TimeoutError) as exc:
        raise LinkCapFailed(f"{instance_id} did not take the link cap: {exc}") from exc
    return LinkCapReport(
        instance=instance_id, role=handle.role.value, gbps=reply.gbps, previous_gbps=reply.previous_gbps
    )
