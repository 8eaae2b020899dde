"""The lease sweep outlives an expiry that fails: a reservation added after one whose expiry
raised still expires (before, the sweep task died with the first failure and every later lease
was held for ever, its blocks with it)."""

from __future__ import annotations

import asyncio

from minipd.disagg.reservations import Reservations


class _Engine:
    def __init__(self):
        self.released: list[int] = []

    def release_blocks(self, block_ids: list[int]) -> None:
        self.released.extend(block_ids)


class _Transport:
    async def abort(self, request_id: str, on_fenced) -> None:
        on_fenced()  # nothing can land: the fence holds at once


async def _run() -> tuple[list[str], list[int]]:
    engine, expired = _Engine(), []
    expiries = {"first": asyncio.Event(), "second": asyncio.Event()}

    def on_expired(request_id: str, reservation) -> None:
        expired.append(request_id)
        expiries[request_id].set()
        if request_id == "first":
            raise RuntimeError("the channel it came from is gone")

    reservations = Reservations(engine, _Transport(), 0.05, "decode-0", on_expired)
    reservations.start()
    try:
        reservations.add("first", [1, 2], [7], 0, channel=None)
        await asyncio.wait_for(expiries["first"].wait(), 5)
        reservations.add("second", [3, 4], [8], 0, channel=None)
        await asyncio.wait_for(expiries["second"].wait(), 5)
    finally:
        await reservations.close()
    return expired, engine.released


def test_a_failing_expiry_does_not_stop_later_leases_from_expiring():
    expired, released = asyncio.run(_run())
    assert expired == ["first", "second"] and released == [7, 8]
