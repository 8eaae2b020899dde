"""An instance's presence in the registry: its `InstanceRecord` under `P/instances/ID`,
attached to a lease the instance keeps alive (session.py).

The record is put when the lease is granted (at start, and again after an expiry or an
etcd outage that outlived the lease), and again at once whenever a role switch gave the
instance a new role and epoch, so every router watching sees the change without polling.
`close` revokes the lease, which deletes the key: routers drop the instance at once. The
instance's id must be one path segment (`records.valid_id`), checked at construction.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from minipd.disagg.instance import Instance
from minipd.ops.registry.etcd_client import ETCD_ERRORS, EtcdEndpoints
from minipd.ops.registry.etcd_url import RegistryUrl
from minipd.ops.registry.records import InstanceRecord, RegistryKeys, TransportInfo, encode, valid_id
from minipd.ops.registry.session import LeaseSession

log = logging.getLogger(__name__)

WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class InstancePublisher:
    def __init__(self, instance: Instance, url: RegistryUrl, host: str, port: int, ttl_s: int):
        if not valid_id(instance.instance_id):
            raise ValueError(
                f"instance_id: {instance.instance_id!r} cannot name a registry key; use letters, digits, '.', '_' "
                "or '-'"
            )
        self.instance = instance
        # a wildcard bind is reached at this host's name
        self.host = socket.getfqdn() if host in WILDCARD_HOSTS else host
        self.port = port
        self.keys = RegistryKeys(url.prefix)
        self.endpoints = EtcdEndpoints(url)
        self.session = LeaseSession(self.endpoints, ttl_s, self._put, instance.instance_id)
        self._republish: asyncio.Task | None = None
        self._dirty = False  # switched again while a put of the new role was under way
        instance.guard.on_switched.append(self._switched)

    def record(self) -> InstanceRecord:
        instance = self.instance
        return InstanceRecord(
            instance_id=instance.instance_id,
            host=self.host,
            port=self.port,
            role=instance.role,
            epoch=instance.guard.epoch,
            fingerprint=instance.fingerprint,
            compute=instance.compute,
            transport=TransportInfo(instance.transport.backend, instance.transport.describe()),
        )

    async def start(self, timeout: float) -> None:
        """Publish; ConnectionError when etcd cannot be reached within `timeout`."""
        await self.session.start(timeout)
        log.info("%s published in the registry at %s", self.instance.instance_id, self.endpoints.url)

    async def _put(self, lease_id: int) -> None:
        await self.endpoints.client.put(self.keys.instance(self.instance.instance_id), encode(self.record()), lease_id)

    def _switched(self) -> None:
        self._dirty = True
        if self._republish is None or self._republish.done():
            self._republish = asyncio.get_running_loop().create_task(self._put_now())

    async def _put_now(self) -> None:
        while self._dirty:
            self._dirty = False
            try:
                await self._put(self.session.lease_id)
            except ETCD_ERRORS as exc:
                # the refresh loop puts it again (session.py) once etcd answers
                log.warning("%s: publishing the new role failed: %s", self.instance.instance_id, exc)
                self.session.mark_unpublished()
                return

    async def close(self) -> None:
        if self._switched in self.instance.guard.on_switched:
            self.instance.guard.on_switched.remove(self._switched)
        if self._republish is not None:
            await asyncio.gather(self._republish, return_exceptions=True)
        await self.session.close()
