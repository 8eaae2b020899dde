"""An instance's presence in the registry: its `InstanceRecord` under `P/instances/ID`,
attached to a lease the instance keeps alive (session.py).

The record is put when the lease is granted (at start, and again after an expiry or an
etcd outage that outlived the lease), and again at once whenever a role switch gave the
instance a new role and epoch, so every router watching sees the change without polling.
The instance watches its own key (a watch re-created after etcd errors and restarts:
watcher.py) and writes the record back at once when anyone else changed or deleted it
(own_key.py): an overwritten record heals within one round trip to etcd. The record names
the process's start nonce (`Instance.start_nonce`), which the routers check in the
handshake, so a record naming another address can never pass another process off as this
one. `close` revokes the lease, which deletes the key: routers drop the instance at once.
The instance's id must be one path segment (`records.valid_id`), checked at construction.
"""

from __future__ import annotations

import logging
import socket

from minipd.disagg.instance import Instance
from minipd.ops.registry.etcd_client import EtcdEndpoints
from minipd.ops.registry.etcd_url import RegistryUrl
from minipd.ops.registry.own_key import OwnKey
from minipd.ops.registry.records import InstanceRecord, RegistryKeys, TransportInfo, encode, valid_id
from minipd.ops.registry.session import LeaseSession
from minipd.ops.registry.watcher import PrefixWatcher

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
        key = self.keys.instance(instance.instance_id)
        self.own_record = OwnKey(self.endpoints, key, lambda: encode(self.record()), instance.instance_id)
        self.session = LeaseSession(self.endpoints, ttl_s, self.own_record.write, instance.instance_id)
        self.own_record.session = self.session
        # a prefix watch of the key itself: the sink ignores longer keys (another id extending ours)
        self.watcher = PrefixWatcher(EtcdEndpoints(url), key, self.own_record)
        instance.guard.on_switched.append(self.own_record.changed)

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
            start_nonce=instance.start_nonce,
        )

    async def start(self, timeout: float) -> None:
        """Publish, then watch the record; ConnectionError when etcd cannot be reached within `timeout`."""
        await self.session.start(timeout)
        await self.watcher.start(timeout)
        log.info("%s published in the registry at %s", self.instance.instance_id, self.endpoints.url)

    async def close(self) -> None:
        if self.own_record.changed in self.instance.guard.on_switched:
            self.instance.guard.on_switched.remove(self.own_record.changed)
        await self.watcher.close()
        await self.own_record.close()
        await self.session.close()
