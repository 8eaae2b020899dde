"""Which process a router expects at an address: the instance id and start nonce a registry
record names, checked against what the process proved in the handshake.

An instance draws its start nonce at random when its process starts and sends it in every
Welcome; the handshake's proof covers it and the instance id (control/handshake.py), so with
a cluster secret neither can be altered on the way. A record whose address answers with
another id or another nonce names a process that is not the one that wrote it (the record
was overwritten, or the process there restarted since): the router does not use that
address for that record (`WrongInstance`), and keeps the instance it already serves.
"""

from __future__ import annotations

from typing import NamedTuple

from minipd.control.messages import Welcome


class WrongInstance(RuntimeError):
    """The process at an address is not the instance a record names; the message says who answered."""


class InstanceIdentity(NamedTuple):
    instance_id: str
    start_nonce: bytes

    @classmethod
    def of(cls, welcome: Welcome) -> "InstanceIdentity":
        return cls(welcome.instance_id, welcome.start_nonce)

    def __str__(self) -> str:
        return f"{self.instance_id} (start {self.start_nonce.hex()[:12]})"


def check_identity(expected: InstanceIdentity, welcome: Welcome, address: tuple[str, int]) -> None:
    """WrongInstance unless the process at `address`, which sent `welcome`, is `expected`."""
    answered = InstanceIdentity.of(welcome)
    if answered != expected:
        raise WrongInstance(f"{address[0]}:{address[1]} answers as {answered}, not as {expected}")
