"""What may run on an instance now: its role and role epoch, the work in flight under them,
and the refusal of new work sent for another epoch or during a switch (role_switch.py says why
epochs exist, and how a switch drains the work in flight and changes role and epoch).

`WorkAdmission` is what every piece of new work meets on its way in (`refused`) and holds
while it runs (`work.holding`); `role_switch.RoleGuard` is it with the switch added.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Callable, Iterator

from minipd.control.channel import Channel
from minipd.control.messages import STALE_EPOCH, CallError, Generate, Prefill, Reserve
from minipd.control.role import Role


class InFlightWork:
    """Requests this instance is working on (by id), and an event set while there are none."""

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()
        self._none = asyncio.Event()
        self._none.set()

    def __len__(self) -> int:
        return sum(self._held.values())

    def hold(self, request_id: str) -> None:
        self._held[request_id] += 1
        self._none.clear()

    def release(self, request_id: str) -> None:
        """End one hold of `request_id`; a no-op for an id not held."""
        if self._held[request_id] <= 1:
            self._held.pop(request_id, None)
        else:
            self._held[request_id] -= 1
        if not self._held:
            self._none.set()

    @contextlib.contextmanager
    def holding(self, request_id: str) -> Iterator[None]:
        self.hold(request_id)
        try:
            yield
        finally:
            self.release(request_id)

    async def wait_none(self, timeout_s: float) -> bool:
        """Wait until no work is held; False on timeout."""
        try:
            await asyncio.wait_for(self._none.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True


class WorkAdmission:
    """The role and epoch of one instance, and what may run under them; `RoleGuard`
    (role_switch.py) adds the switch."""

    def __init__(self, instance_id: str, role: Role, epoch: int = 0):
        """`epoch`: the role epoch it starts at (0; a restarted instance starts above its
        predecessor's, so work sent to the old process under its epoch is refused as stale)."""
        if not role.is_instance:
            raise ValueError(f"role: {role.value!r} is not an instance role")
        if epoch < 0:
            raise ValueError(f"start_epoch: must be >= 0, got {epoch}")
        self.instance_id = instance_id
        self.role = role
        self.epoch = epoch
        self.switching_to: Role | None = None  # set while a switch drains the instance
        self.draining = asyncio.Event()  # set while it is so (for observers and tests)
        self.work = InFlightWork()
        self.on_switched: list[Callable[[], None]] = []  # called once a switch took the new role

    @property
    def switching(self) -> bool:
        return self.switching_to is not None

    def refusal(self, epoch: int | None) -> CallError | None:
        """Why new work sent under `epoch` must be refused now (None: take it). An epoch of
        None is not checked (a sender without epochs), but still refused during a switch."""
        if self.switching_to is not None:
            return CallError(
                kind=STALE_EPOCH,
                message=(
                    f"{self.instance_id} is switching from {self.role.value} to {self.switching_to.value} "
                    f"(epoch {self.epoch}); it takes no new work"
                ),
            )
        if epoch is not None and epoch != self.epoch:
            return CallError(
                kind=STALE_EPOCH,
                message=(
                    f"{self.instance_id}: role epoch {epoch} is stale; it is a {self.role.value} instance at epoch "
                    f"{self.epoch}"
                ),
            )
        return None

    def refused(self, channel: Channel, message: Reserve | Prefill | Generate) -> bool:
        """Answer new work that must be refused now (see `refusal`); True if refused. A call
        gets the error as its reply; a `Generate` gets it in place of its stream."""
        error = self.refusal(message.epoch)
        if error is None:
            return False
        if isinstance(message, Generate):
            error.request_id = message.request_id
            channel.send(error)
        else:
            channel.reply(message, error)
        return True
