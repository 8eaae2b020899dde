"""Who may switch an instance's role: the router asks for a claim before it switches.

`claim(instance_id, epoch, target)` is an async context manager held for the whole switch.
The embedded default (`LOCAL_CLAIMS`) grants every claim: one router, whose own checks
(already switching, the last decode instance) suffice. With a registry, the claim is an etcd
transaction that one router only wins (minipd/ops/registry/epoch_cas.py); the others raise
SwitchConflict.
"""

from __future__ import annotations

import contextlib
from typing import AsyncContextManager, Protocol

from minipd.control.role import Role


class SwitchClaims(Protocol):
    def claim(self, instance_id: str, epoch: int, target: Role) -> AsyncContextManager[None]:
        """Held while switching `instance_id` from role epoch `epoch` to `target`; raises
        SwitchConflict when another router holds or won it, or the epoch moved on."""


class _LocalClaims:
    @contextlib.asynccontextmanager
    async def claim(self, instance_id: str, epoch: int, target: Role):
        yield


LOCAL_CLAIMS: SwitchClaims = _LocalClaims()
