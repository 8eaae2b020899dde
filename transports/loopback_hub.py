"""Where in-process loopback transports find each other."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from minipd.transports.errors import TransferError

if TYPE_CHECKING:
    from minipd.transports.loopback import LoopbackTransport

HUB_TOKEN_BYTES = 16


class LoopbackHub:
    """Maps instance ids to the loopback transports of one process. Create one per process
    (or per test) and pass it to every loopback transport that should reach the others;
    its random token in each description stops a peer from another hub being mistaken for
    one of ours."""

    def __init__(self) -> None:
        self.token = os.urandom(HUB_TOKEN_BYTES)
        self._transports: dict[str, LoopbackTransport] = {}

    def add(self, instance_id: str, transport: LoopbackTransport) -> None:
        if instance_id in self._transports:
            raise ValueError(f"loopback instance {instance_id!r} is already registered")
        self._transports[instance_id] = transport

    def get(self, instance_id: str) -> LoopbackTransport:
        try:
            return self._transports[instance_id]
        except KeyError:
            raise TransferError(instance_id, "", "no such loopback instance (closed?)") from None

    def remove(self, instance_id: str) -> None:
        self._transports.pop(instance_id, None)
