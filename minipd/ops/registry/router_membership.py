"""A router's membership from the registry: it watches the prefix (watcher.py), keeps its
instances in step with their records (instance_joins.py), and stops sending new work to an
instance while a switch claim it honours is on it (claim_view.py).

The router's own lease carries its record `P/routers/NAME` (written again at once if anyone
else changes or deletes it: own_key.py) and its switch claims (epoch_cas.py): other routers
honour a claim only under the lease of the router it names. Every key the router acts on is
bound to a live lease of its writer; one that is not (no lease, another writer's lease, a
router not in the registry) is ignored and deleted, logged. A value that is not a valid
record is logged and ignored (records.py); the router keeps what it knew of that key.
While etcd is unreachable the router serves with the membership it knows; the watch
resumes from the last revision seen.
"""

from __future__ import annotations

import logging
import os
import socket

from minipd.ops.registry.claim_view import ClaimView
from minipd.ops.registry.epoch_cas import EtcdSwitchClaims
from minipd.ops.registry.etcd_client import EtcdEndpoints
from minipd.ops.registry.etcd_url import RegistryUrl
from minipd.ops.registry.instance_joins import InstanceJoins
from minipd.ops.registry.key_cleanup import KeyCleanup
from minipd.ops.registry.own_key import OwnKey
from minipd.ops.registry.records import (
    BadRecord,
    InstanceRecord,
    RegistryKeys,
    RouterRecord,
    SwitchClaim,
    decode_claim,
    decode_instance,
    decode_router,
    encode,
)
from minipd.ops.registry.session import LeaseSession
from minipd.ops.registry.watcher import Entry, PrefixWatcher
from minipd.router.router import Router

log = logging.getLogger(__name__)


class EtcdRouterMembership:
    def __init__(self, router: Router, url: RegistryUrl, ttl_s: int):
        self.router = router
        self.keys = RegistryKeys(url.prefix)
        self.name = f"router-{socket.gethostname()}-{os.getpid()}"
        endpoints = EtcdEndpoints(url)
        self.own_record = OwnKey(endpoints, self.keys.router(self.name), self._record, self.name)
        self.session = LeaseSession(endpoints, ttl_s, self.own_record.write, self.name)
        self.own_record.session = self.session
        self.claims = EtcdSwitchClaims(endpoints, self.keys, self.session, self.name)
        self.cleanup = KeyCleanup(endpoints, self.name)
        self.claim_view = ClaimView(self.claims, self.cleanup, self._claim_changed)
        self.joins = InstanceJoins(router, self.cleanup, lambda i: i in self.claim_view.honoured)
        self.watcher = PrefixWatcher(EtcdEndpoints(url), self.keys.all, self)
        self.num_ignored = 0  # values that were not valid records

    @property
    def records(self) -> dict[str, InstanceRecord]:
        return self.joins.records

    @property
    def switch_claims(self) -> dict[str, SwitchClaim]:
        """The claims honoured now, by instance id."""
        return self.claim_view.honoured

    def _record(self) -> bytes:
        return encode(RouterRecord(name=self.name))

    async def start(self, timeout: float) -> None:
        """Take the router's lease (writing its record), read the registry and connect to every
        instance in it (each within `timeout`), then follow the watch. ConnectionError: etcd
        unreachable."""
        await self.session.start(timeout)
        self.router.switch_claims = self.claims
        await self.watcher.start(timeout)
        await self.joins.wait(timeout)

    async def close(self) -> None:
        self.joins.close()
        await self.watcher.close()
        await self.own_record.close()
        await self.claims.close()
        await self.cleanup.close()
        await self.session.close()  # revoking the lease ends the record and any claim left

    # ---- the watch's events (watcher.WatchSink) -------------------------------------------
    def snapshot(self, items: list[Entry]) -> None:
        parsed = [(self.keys.parse(e.key), e) for e in items]
        seen = {p for p, _ in parsed if p is not None}
        for _, entry in sorted((p for p in parsed if p[0] is not None), key=lambda p: p[0][0] != "router"):
            self.put(entry)  # routers first: a claim is judged against the routers' records
        for instance_id in [i for i in self.records if ("instance", i) not in seen]:
            self.joins.delete(instance_id)
        self.claim_view.clear(seen)
        if ("router", self.name) not in seen:
            self.own_record.seen(None)

    def put(self, entry: Entry) -> None:
        parsed = self.keys.parse(entry.key)
        if parsed is None:
            return  # not a key minipd writes
        kind, name = parsed
        try:
            if kind == "instance":
                self.joins.put(name, decode_instance(name, entry.value), entry)
            elif kind == "switch":
                self.claim_view.claim_put(name, decode_claim(name, entry.value), entry)
            else:
                decode_router(name, entry.value)
                if name == self.name:
                    self.own_record.seen(entry)
                self.claim_view.router_put(name, entry)
        except BadRecord as exc:
            self.num_ignored += 1
            log.warning("registry: ignoring the value of %s: %s", entry.key.decode("utf-8", "replace"), exc)
            if kind == "router" and name == self.name:
                self.own_record.seen(entry)

    def delete(self, key: bytes) -> None:
        parsed = self.keys.parse(key)
        if parsed is None:
            return
        kind, name = parsed
        if kind == "instance":
            self.joins.delete(name)
        elif kind == "switch":
            self.claim_view.claim_deleted(name)
        else:
            if name == self.name:
                self.own_record.seen(None)
            self.claim_view.router_deleted(name)

    def _claim_changed(self, instance_id: str, honoured: bool) -> None:
        """No new work reaches an instance while another router switches it."""
        handle = self.router.registry.instances.get(instance_id)
        if handle is not None and (honoured or instance_id not in self.claims.held):
            handle.draining = honoured
