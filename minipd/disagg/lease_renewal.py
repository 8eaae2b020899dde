"""The prefill side renews the decode instance's reservation while, and only while, it progresses.

A reservation's lease (decode side, `reservations.py`) must outlive a long prefill but must not
be held forever by one that stopped: so the prefill instance itself sends `Renew` (through the
router, which forwards it to the decode instance) each period in which the request moved on:
a chunk computed, a layer write completed, or, still queued, the engine ran a step (its turn
comes). A frozen process sends nothing; a stalled transfer or a wedged engine shows no
progress; either way the lease then runs out on the decode side and its blocks go back.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Hashable

from minipd.control.channel import Channel
from minipd.control.messages import Renew
from minipd.engine.engine import Engine
from minipd.engine.request import Request, RequestStatus
from minipd.transports.base import Transport

RENEWALS_PER_LEASE = 3  # progress is looked at, and renewed, this often per lease


def prefill_progress(engine: Engine, transport: Transport, request: Request) -> Callable[[], Hashable]:
    """A snapshot of how far the prefill of `request` got; it changes whenever it progresses."""

    def snapshot() -> Hashable:
        queued = request.status is RequestStatus.WAITING
        return (
            request.num_computed_tokens,
            transport.num_writes_done(request.request_id),
            engine.num_steps if queued else 0,
        )

    return snapshot


async def renew_while_progressing(
    channel: Channel, request_id: str, lease_s: float, progress: Callable[[], Hashable]
) -> None:
    """Send `Renew(request_id)` on `channel` once per period in which `progress()` changed.
    Runs until cancelled (when the prefill call ends)."""
    last = progress()
    while True:
        await asyncio.sleep(lease_s / RENEWALS_PER_LEASE)  # the renewal period
        now = progress()
        if now != last:
            channel.send(Renew(request_id=request_id))
        last = now
