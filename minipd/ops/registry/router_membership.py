"""A router's membership from the registry: it watches the prefix (watcher.py) and keeps
its instances (router/instance_links.py) in step with what is there.

- A record that appears (or names a new address) is connected to at once, and retried,
  backing off, while that record stays; the instance serves from its first stats on. Its
  address becomes a member that the links redial if the connection is lost while the key
  stays.
- A record whose role epoch moved on (a switch, by any router) gives the instance its new
  role and epoch at once; a switch claim (epoch_cas.py) stops new work reaching the
  instance until the claim is gone.
- A deleted key (the instance's lease expired: no sign of life within the TTL, or it shut
  down) drops the instance: declared dead, its requests retried, its address no longer
  redialed.
- A value that is not a valid record is logged and ignored (records.py); the router keeps
  what it knew of that key.
While etcd is unreachable the router serves with the membership it knows; the watch
resumes from the last revision seen. The router's own lease holds its switch claims only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from minipd.ops.registry.epoch_cas import EtcdSwitchClaims
from minipd.ops.registry.etcd_client import EtcdEndpoints
from minipd.ops.registry.etcd_url import RegistryUrl
from minipd.ops.registry.records import (
    BadRecord,
    InstanceRecord,
    RegistryKeys,
    SwitchClaim,
    decode_claim,
    decode_instance,
)
from minipd.ops.registry.session import LeaseSession
from minipd.ops.registry.watcher import PrefixWatcher
from minipd.router.instance_links import REDIAL_ERRORS, NotSettled
from minipd.router.registry import IncompatibleInstance
from minipd.router.router import Router

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 15.0  # one connection try: handshake and settled stats
JOIN_RETRY_FIRST_S = 0.1
JOIN_RETRY_MAX_S = 2.0


class EtcdRouterMembership:
    def __init__(self, router: Router, url: RegistryUrl, ttl_s: int):
        self.router = router
        self.keys = RegistryKeys(url.prefix)
        self.name = f"router-{socket.gethostname()}-{os.getpid()}"
        claim_endpoints = EtcdEndpoints(url)
        self.session = LeaseSession(claim_endpoints, ttl_s, self._no_keys, self.name)
        self.claims = EtcdSwitchClaims(claim_endpoints, self.keys, self.session, self.name)
        self.watcher = PrefixWatcher(EtcdEndpoints(url), self.keys.all, self)
        self.records: dict[str, InstanceRecord] = {}
        self.switch_claims: dict[str, SwitchClaim] = {}
        self._joining: dict[str, asyncio.Task] = {}
        self.num_ignored = 0  # values that were not valid records

    async def start(self, timeout: float) -> None:
        """Take the router's lease, read the registry and connect to every instance in it
        (each within `timeout`), then follow the watch. ConnectionError: etcd unreachable."""
        await self.session.start(timeout)
        self.router.switch_claims = self.claims
        await self.watcher.start(timeout)
        if self._joining:
            await asyncio.wait(list(self._joining.values()), timeout=timeout)

    async def close(self) -> None:
        for task in list(self._joining.values()):
            task.cancel()
        await self.watcher.close()
        await self.claims.close()
        await self.session.close()  # revoking the lease ends any claim left

    @staticmethod
    async def _no_keys(lease_id: int) -> None:
        """The router's lease carries only its switch claims, put as they are taken."""

    # ---- the watch's events (watcher.WatchSink) -------------------------------------------
    def snapshot(self, items: list[tuple[bytes, bytes]]) -> None:
        seen: set[tuple[str, str]] = set()
        for key, value in items:
            parsed = self.keys.parse(key)
            if parsed is not None:
                seen.add(parsed)
                self.put(key, value)
        for instance_id in [i for i in self.records if ("instance", i) not in seen]:
            self._drop(instance_id)
        for instance_id in [i for i in self.switch_claims if ("switch", i) not in seen]:
            self._unclaimed(instance_id)

    def put(self, key: bytes, value: bytes) -> None:
        parsed = self.keys.parse(key)
        if parsed is None:
            return  # not a key minipd writes
        kind, instance_id = parsed
        try:
            if kind == "instance":
                self._joined(instance_id, decode_instance(instance_id, value))
            else:
                self._claimed(instance_id, decode_claim(instance_id, value))
        except BadRecord as exc:
            self.num_ignored += 1
            log.warning("registry: ignoring the value of %s: %s", key.decode("utf-8", "replace"), exc)

    def delete(self, key: bytes) -> None:
        parsed = self.keys.parse(key)
        if parsed is None:
            return
        kind, instance_id = parsed
        if kind == "instance":
            self._drop(instance_id)
        else:
            self._unclaimed(instance_id)

    # ---- instances ------------------------------------------------------------------------
    def _joined(self, instance_id: str, record: InstanceRecord) -> None:
        old = self.records.get(instance_id)
        self.records[instance_id] = record
        address = (record.host, record.port)
        if old is not None and (old.host, old.port) != address:
            self.router.links.forget((old.host, old.port))
        handle = self.router.registry.instances.get(instance_id)
        if handle is not None and handle.is_alive and handle.address == address:
            self._take_role(handle, record)
            return
        if handle is not None and handle.is_alive:  # the instance restarted elsewhere
            self.router.links.evict(handle, f"it is registered at {record.host}:{record.port} now")
        task = self._joining.pop(instance_id, None)
        if task is not None:
            task.cancel()
        task = asyncio.get_running_loop().create_task(self._join(instance_id, record))
        self._joining[instance_id] = task
        task.add_done_callback(
            lambda t: self._joining.pop(instance_id, None) if self._joining.get(instance_id) is t else None
        )

    def _joined_done(self, instance_id: str, task: asyncio.Task) -> None:
        if self._joining.get(instance_id) is task:
            del self._joining[instance_id]

    async def _join(self, instance_id: str, record: InstanceRecord) -> None:
        """Connect to the instance `record` names, retrying while the record stays."""
        delay, tries = JOIN_RETRY_FIRST_S, 0
        while self.records.get(instance_id) is record:
            try:
                handle = await self.router.links.connect(record.host, record.port, JOIN_TIMEOUT_S)
            except IncompatibleInstance as exc:
                log.error("registry: not using %s: %s", instance_id, exc)
                return
            except (NotSettled, *REDIAL_ERRORS) as exc:
                tries += 1
                level = logging.WARNING if tries == 1 else logging.DEBUG
                log.log(
                    level,
                    "registry: connecting to %s at %s:%d (try %d): %s",
                    instance_id,
                    record.host,
                    record.port,
                    tries,
                    exc,
                )
                await asyncio.sleep(delay)  # backoff while the instance does not answer
                delay = min(2 * delay, JOIN_RETRY_MAX_S)
                continue
            if handle.instance_id != instance_id:
                log.error(
                    "registry: the record of %s names %s:%d, where %s answers; ignoring it",
                    instance_id,
                    record.host,
                    record.port,
                    handle.instance_id,
                )
                return
            if instance_id in self.switch_claims:
                handle.draining = True
            self._take_role(handle, record)
            return

    @staticmethod
    def _take_role(handle, record: InstanceRecord) -> None:
        if record.epoch > handle.epoch:
            log.info("registry: %s is a %s instance at epoch %d", handle.instance_id, record.role.value, record.epoch)
            handle.take_role(record.role, record.epoch)

    def _drop(self, instance_id: str) -> None:
        record = self.records.pop(instance_id, None)
        task = self._joining.pop(instance_id, None)
        if task is not None:
            task.cancel()
        if record is None:
            return
        address = (record.host, record.port)
        self.router.links.forget(address)
        handle = self.router.registry.instances.get(instance_id)
        if handle is not None and handle.address == address:
            self.router.links.evict(handle, "its registry key is gone (its lease expired, or it shut down)")

    # ---- switch claims ----------------------------------------------------------------------
    def _claimed(self, instance_id: str, claim: SwitchClaim) -> None:
        self.switch_claims[instance_id] = claim
        handle = self.router.registry.instances.get(instance_id)
        if handle is not None:
            handle.draining = True  # no new work while another router switches it

    def _unclaimed(self, instance_id: str) -> None:
        self.switch_claims.pop(instance_id, None)
        handle = self.router.registry.instances.get(instance_id)
        if handle is not None and instance_id not in self.claims.held:
            handle.draining = False
