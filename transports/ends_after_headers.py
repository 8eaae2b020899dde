"""Ending a request once every layer's header is out, before the payloads complete (UCX).

A backend whose receiver posts its own receives for every announced layer learns by itself
when the bytes landed, and whose transport keeps messages to one peer in order (UCX's tag
matching does) may send the end of a request as soon as the last layer's header has gone
out: the end then arrives after every header, and the receiver completes the request when
its own receives do. That saves the wait for the last payload's completion before the
receiver may hear of the end — one round trip per request.

Backends mix `EndsAfterHeaders` in before `Transport` and call `_header_out(request_id)`
right after each layer's header is posted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from minipd.transports.base import Transport
from minipd.transports.request_calls import _Sending


class _Headers:
    def __init__(self) -> None:
        self.num_out = 0
        self.changed = asyncio.Event()


class EndsAfterHeaders(Transport):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._headers: dict[str, _Headers] = {}

    def _header_out(self, request_id: str) -> None:
        """One more layer header of `request_id` has gone out."""
        if request_id not in self._sending:
            return  # aborted meanwhile: nobody will wait for its end
        headers = self._headers.setdefault(request_id, _Headers())
        headers.num_out += 1
        headers.changed.set()

    async def abort(
        self, request_id: str, on_fenced: Callable[[], None] | None = None, peer_id: str | None = None
    ) -> bool:
        self._headers.pop(request_id, None)
        return await super().abort(request_id, on_fenced, peer_id)

    async def _end_before_writes_complete(
        self, peer_id: str, request_id: str, sending: _Sending, writes: asyncio.Future
    ) -> bool:
        headers = self._headers.setdefault(request_id, _Headers())
        try:
            while headers.num_out < len(sending.writes) and not writes.done():
                headers.changed.clear()
                changed = asyncio.ensure_future(headers.changed.wait())
                await asyncio.wait([writes, changed], return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
        finally:
            self._headers.pop(request_id, None)
        if writes.done():
            return False  # nothing to gain: the ordinary end follows
        await self._guard(peer_id, request_id, self._send_end(peer_id, request_id, sending.num_bytes))
        return True
