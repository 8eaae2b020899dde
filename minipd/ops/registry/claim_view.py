"""Which switch claims a router honours: only those bound to the live lease of the router
they name.

A claim (`P/switches/ID`, epoch_cas.py) stops every router sending instance ID new work while
it exists. Anyone who can write to etcd can write one, so a router honours a claim only if
- it was written under a lease (a claim without one would outlive every process),
- the router it names is in the registry (`P/routers/NAME`, which that router keeps under
  its lease while it lives, router_membership.py), and
- its lease is that router's (so it ends with that router, at the latest one TTL after it
  died), and
- when it names this router, this router holds it or is taking it (a copy written under
  this router's lease by someone else would otherwise last as long as this router).
A claim that fails one of these is not honoured, is logged (`num_refused`), and is deleted
(as seen: key_cleanup.py). Claims naming a router are judged again when that router's record
changes lease or goes (its claims go with its lease; this covers a watch that missed it).

The watch delivers keys in the order they were written, and a router writes its record
before any claim, so a real claim never arrives before its router's record.
`on_change(instance_id, honoured)` tells the router when the honoured claim on an instance
appears or goes.
"""

from __future__ import annotations

import logging
from typing import Callable

from minipd.ops.registry.epoch_cas import EtcdSwitchClaims
from minipd.ops.registry.key_cleanup import KeyCleanup
from minipd.ops.registry.records import SwitchClaim
from minipd.ops.registry.watcher import Entry

log = logging.getLogger(__name__)


class ClaimView:
    def __init__(
        self,
        own_claims: EtcdSwitchClaims,
        cleanup: KeyCleanup,
        on_change: Callable[[str, bool], None],
    ):
        self.own_claims, self.cleanup, self._on_change = own_claims, cleanup, on_change
        self.routers: dict[str, int] = {}  # live router name -> the lease of its record
        self.honoured: dict[str, SwitchClaim] = {}  # instance id -> the claim honoured on it
        self._seen: dict[str, tuple[SwitchClaim, Entry]] = {}  # instance id -> the claim in etcd
        self.num_refused = 0

    # ---- routers' records --------------------------------------------------------------------
    def router_put(self, name: str, entry: Entry) -> None:
        if entry.lease == 0:
            self.cleanup.delete(entry, "a router record without a lease is no live router's")
            self.router_deleted(name)
            return
        if self.routers.get(name) != entry.lease:
            self.routers[name] = entry.lease
            self._judge_claims_of(name)

    def router_deleted(self, name: str) -> None:
        if self.routers.pop(name, None) is not None:
            self._judge_claims_of(name)

    def _judge_claims_of(self, name: str) -> None:
        for instance_id in [i for i, (claim, _) in self._seen.items() if claim.router == name]:
            self._judge(instance_id)

    # ---- claims ------------------------------------------------------------------------------
    def claim_put(self, instance_id: str, claim: SwitchClaim, entry: Entry) -> None:
        self._seen[instance_id] = (claim, entry)
        self._judge(instance_id)

    def claim_deleted(self, instance_id: str) -> None:
        self._seen.pop(instance_id, None)
        self._set(instance_id, None)

    def why_refused(self, claim: SwitchClaim, entry: Entry) -> str | None:
        """Why `claim`, as written in `entry`, is not honoured; None if it is."""
        if entry.lease == 0:
            return "it was written without a lease"
        lease = self.routers.get(claim.router)
        if lease is None:
            return f"router {claim.router!r} is not in the registry"
        if entry.lease != lease:
            return f"its lease {entry.lease:x} is not the lease of router {claim.router!r} ({lease:x})"
        if claim.router == self.own_claims.router_name and not self.own_claims.holds(claim.instance_id):
            return "it names this router, which does not hold it"
        return None

    def _judge(self, instance_id: str) -> None:
        claim, entry = self._seen[instance_id]
        why = self.why_refused(claim, entry)
        if why is None:
            self._set(instance_id, claim)
            return
        self.num_refused += 1
        log.warning(
            "registry: not honouring the switch claim on %s by %r: %s; deleting it", instance_id, claim.router, why
        )
        self._set(instance_id, None)
        self.cleanup.delete(entry, f"a switch claim not honoured: {why}")

    def _set(self, instance_id: str, claim: SwitchClaim | None) -> None:
        was = instance_id in self.honoured
        if claim is None:
            self.honoured.pop(instance_id, None)
        else:
            self.honoured[instance_id] = claim
        if was != (claim is not None):
            self._on_change(instance_id, claim is not None)

    def clear(self, keep: set[str]) -> None:
        """After a fresh read of the registry: forget the claims and routers not in `keep`
        (("switch", id) and ("router", name) pairs)."""
        for name in [n for n in self.routers if ("router", n) not in keep]:
            self.router_deleted(name)
        for instance_id in [i for i in self._seen if ("switch", i) not in keep]:
            self.claim_deleted(instance_id)
