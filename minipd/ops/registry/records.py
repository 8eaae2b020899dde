"""What the registry holds, where, and how a value read from it is checked.

Keys, under the URL's prefix P:
- `P/instances/ID`: an instance's `InstanceRecord`, written by the instance itself under its
  lease (the key vanishes when the lease expires: the instance is dead for every router);
  the instance watches it and writes it again whenever anyone else changes or deletes it;
- `P/routers/NAME`: a router's `RouterRecord`, under the router's lease: the router is alive;
- `P/switches/ID`: a `SwitchClaim`, written by the router that won the right to switch
  instance ID (epoch_cas.py), under that router's lease, deleted once the switch ended.

Values are JSON. They come from the network (anyone who can write to etcd can write them),
so each is decoded into its typed struct with size caps and range checks; `BadRecord`
says what is wrong with one, and the reader logs it and ignores the key. Nothing in a
record is trusted for security: a router connects to the address named, the cluster secret
authenticates the instance there, and the handshake must show the id and start nonce the
record names (router/instance_identity.py); the fingerprint is checked again. A key with no
lease is never a minipd process's (each writes under its lease, so its keys die with it):
routers ignore it (claim_view.py, router_membership.py).
"""

from __future__ import annotations

import re

import msgspec

from minipd.control.messages import Fingerprint
from minipd.control.role import Role
from minipd.transports.shared_secret import NONCE_BYTES
from minipd.transports.wire import MAX_DESCRIPTION_BYTES

MAX_RECORD_BYTES = 4 * MAX_DESCRIPTION_BYTES  # a description (base64: 4/3 of it) and a fingerprint, with room
MAX_ID_CHARS = 128
_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_HOST = re.compile(r"^[A-Za-z0-9.:-]{1,253}$")


class BadRecord(ValueError):
    """A registry value that cannot be used; the message says why."""


class TransportInfo(msgspec.Struct, frozen=True):
    backend: str  # a key of transports.registry.BACKENDS
    description: bytes = b""  # the instance's transport description (base64 in JSON)


class InstanceRecord(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    host: str  # its control address
    port: int
    role: Role
    epoch: int  # its role epoch
    fingerprint: Fingerprint
    compute: str  # host and device or cores (Welcome.compute)
    transport: TransportInfo
    start_nonce: bytes  # random at the process's start (Welcome.start_nonce; base64 in JSON)


class RouterRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A live router: the lease it is written under is the one its switch claims must carry."""

    name: str


class SwitchClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A router's claim on switching an instance away from the role epoch `from_epoch`."""

    instance_id: str
    router: str  # who claimed it (for the 409 the loser answers)
    from_epoch: int
    to_role: Role


def valid_id(instance_id: str) -> bool:
    """Whether `instance_id` can name a registry key (one path segment)."""
    return bool(_ID.match(instance_id))


class RegistryKeys:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.instances = f"{prefix}/instances/".encode()
        self.switches = f"{prefix}/switches/".encode()
        self.routers = f"{prefix}/routers/".encode()
        self.all = f"{prefix}/".encode()

    def instance(self, instance_id: str) -> bytes:
        return self.instances + instance_id.encode()

    def switch(self, instance_id: str) -> bytes:
        return self.switches + instance_id.encode()

    def router(self, name: str) -> bytes:
        return self.routers + name.encode()

    def parse(self, key: bytes) -> tuple[str, str] | None:
        """("instance", "switch" or "router", the id or name) for a key of ours, else None."""
        for kind, prefix in (("instance", self.instances), ("switch", self.switches), ("router", self.routers)):
            if key.startswith(prefix):
                return kind, key[len(prefix) :].decode("utf-8", "replace")
        return None


def encode(record: InstanceRecord | SwitchClaim | RouterRecord) -> bytes:
    return msgspec.json.encode(record)


def decode_instance(instance_id: str, value: bytes) -> InstanceRecord:
    """The record under `P/instances/instance_id`, checked; BadRecord says what is wrong."""
    record = _decode(value, InstanceRecord)
    if record.instance_id != instance_id:
        raise BadRecord(f"instance_id: {record.instance_id!r} under the key of {instance_id!r}")
    if not valid_id(record.instance_id):
        raise BadRecord(f"instance_id: {record.instance_id!r} is not a valid instance id")
    if not _HOST.match(record.host):
        raise BadRecord(f"host: {record.host!r} is not a host name or address")
    if not 0 < record.port < 65536:
        raise BadRecord(f"port: {record.port} is not in 1-65535")
    if not record.role.is_instance:
        raise BadRecord(f"role: {record.role.value!r} is not an instance role")
    if record.epoch < 0:
        raise BadRecord(f"epoch: {record.epoch} is negative")
    if len(record.transport.description) > MAX_DESCRIPTION_BYTES:
        raise BadRecord(f"transport.description: more than {MAX_DESCRIPTION_BYTES} bytes")
    if len(record.start_nonce) != NONCE_BYTES:
        raise BadRecord(f"start_nonce: {len(record.start_nonce)} bytes, not {NONCE_BYTES}")
    return record


def decode_router(name: str, value: bytes) -> RouterRecord:
    record = _decode(value, RouterRecord)
    if record.name != name:
        raise BadRecord(f"name: {record.name!r} under the key of {name!r}")
    return record


def decode_claim(instance_id: str, value: bytes) -> SwitchClaim:
    claim = _decode(value, SwitchClaim)
    if claim.instance_id != instance_id:
        raise BadRecord(f"instance_id: {claim.instance_id!r} under the key of {instance_id!r}")
    if not valid_id(claim.router):
        raise BadRecord(f"router: {claim.router!r} is not a valid router name")
    return claim


def _decode(value: bytes, kind: type):
    if len(value) > MAX_RECORD_BYTES:
        raise BadRecord(f"{len(value)} bytes, more than the {MAX_RECORD_BYTES} a record may have")
    try:
        return msgspec.json.decode(value, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadRecord(str(exc)) from None
