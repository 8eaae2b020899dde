"""The consumer side of one request: an async iterator of `RequestOutput` increments."""

from __future__ import annotations

import asyncio
from typing import Callable

from minipd.engine.request import Request, RequestOutput


class RequestStream:
    """Iterate to receive increments until one has `finished`.

    Used as an async context manager, leaving the block before the request finished (an
    exception, a client disconnect, `break`) aborts the request, so its blocks are freed.
    """

    def __init__(self, request_id: str, abort: Callable[[str], object], request: Request | None = None):
        self.request = request  # the engine's request, when the stream comes from a local engine
        self.request_id = request_id
        self._abort = abort
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.finished = False

    def put(self, output: RequestOutput) -> None:
        self._queue.put_nowait(output)

    def abort(self) -> None:
        if not self.finished:
            self._abort(self.request_id)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        output = await self._queue.get()
        self.finished = output.finished
        return output

    async def __aenter__(self) -> "RequestStream":
        return self

    async def __aexit__(self, *exc) -> None:
        self.abort()
