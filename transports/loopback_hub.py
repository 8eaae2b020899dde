"""Where in-process loopback transports find each other."""

from __future__ import annotations

import os
from typing import Generic, TypeVar

from minipd.transports.transfer_error import TransferError

HUB_TOKEN_BYTES = 16

# the loopback transport (loopback.py imports this module, so the hub names it only as a type
# parameter: no import cycle)
T = TypeVar("T")


class LoopbackHub(Generic[T]):
    """Maps instance ids to the loopback transports of one process. Create one per process
    (or per test) and pass it to every loopback transport that should reach the others;
    its random token in each description stops a peer from another hub being mistaken for
    one of ours."""

    def __init__(self) -> None:
        self.token = os.urandom(HUB_TOKEN_BYTES)
        self._transports: dict[str, T] = {}

    def add(self, instance_id: str, transport: T) -> None:
        if instance_id in self._transports:
            raise ValueError(f"loopback instance {instance_id!r} is already registered")
        self._transports[instance_id] = transport

    def get(self, instance_id: str) -> T:
        try:
            return self._transports[instance_id]
        except KeyError:
            raise TransferError(instance_id, "", "no such loopback instance (closed?)") from None

    def remove(self, instance_id: str) -> None:
        self._transports.pop(instance_id, None)
