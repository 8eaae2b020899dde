"""Receiver side: aborted requests whose blocks wait for their fence.

An aborted request's blocks go back to their owner (`on_fenced`) only once no byte of the
request can land in them any more. Most of the time that is at once (the backend refuses the
late bytes itself); otherwise the blocks are held here, counted, until the backend's fence
holds (the one-sided writer ended the request, the posted receives were cancelled) or the
peer is known unable to write (its process is gone). Nothing is ever leaked: every held
request is released exactly once, by its fence, its peer's loss, or the transport's close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

logger = logging.getLogger(__name__)


class _Held(NamedTuple):
    peer_id: str
    on_fenced: list[Callable[[], None]]  # every owner callback waiting for this fence
    task: asyncio.Task


class Fences:
    """The held requests of one receiver; used from the event-loop thread only."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def hold(self, request_id: str, peer_id: str, on_fenced: Callable[[], None] | None, fence: Awaitable[None]) -> None:
        """Hold `request_id` until `fence` completes (then `on_fenced` is called) or it is
        released otherwise."""
        task = asyncio.ensure_future(fence)
        self._held[request_id] = _Held(peer_id, [] if on_fenced is None else [on_fenced], task)
        task.add_done_callback(lambda t: t.cancelled() or self.release(request_id, cancel=False))

    def join(self, request_id: str, on_fenced: Callable[[], None] | None) -> None:
        """`request_id` is held already (aborted twice): `on_fenced` is called with the others."""
        if on_fenced is not None:
            self._held[request_id].on_fenced.append(on_fenced)

    def release(self, request_id: str, cancel: bool = True) -> None:
        held = self._held.pop(request_id, None)
        if held is None:
            return
        if not cancel and held.task.exception() is not None:
            logger.error("fence of %r failed: %r", request_id, held.task.exception())
        if cancel:
            held.task.cancel()
        for on_fenced in held.on_fenced:
            call(on_fenced, request_id)

    def release_peer(self, peer_id: str) -> None:
        """`peer_id` can write no more (its process is gone): release everything held for it."""
        for request_id in [r for r, h in self._held.items() if h.peer_id == peer_id]:
            self.release(request_id)

    def release_all(self) -> None:
        for request_id in list(self._held):
            self.release(request_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    def __len__(self) -> int:
        return len(self._held)


def call(on_fenced: Callable[[], None] | None, request_id: str) -> None:
    if on_fenced is None:
        return
    try:
        on_fenced()
    except Exception:  # the owner's bookkeeping must not break the transport's
        logger.exception("releasing the blocks of %r failed", request_id)
