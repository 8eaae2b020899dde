"""Base of the control-plane servers (instances and the router's client port).

It accepts connections, remembers which requests arrived through each, and aborts those
when the connection drops, so a vanished router or client never leaves work behind. A
connection this end gives up on (its peer went silent, or evicted us) is ended the other way
round: its requests are aborted first, then it is closed, so that whoever watches the
connection knows, once it closes, that nothing of ours is still writing for it.

Shutdown (`drain`): stop accepting connections, let the requests under way finish until a
deadline, and say whether any were left to abort.
"""

from __future__ import annotations

import asyncio
import logging

from minipd.control.channel import Channel, serve
from minipd.control.messages import PROTOCOL_VERSION, CallError, Hello, Message

log = logging.getLogger(__name__)


class ControlServer:
    def __init__(self, name: str):
        self.name = name
        self.port = 0
        self.accepting = True  # False once draining: new requests are refused
        self._server: asyncio.Server | None = None
        self._requests_of: dict[Channel, set[str]] = {}
        self._untracked = asyncio.Event()  # set whenever a request stops being tracked

    async def serve(self, host: str, port: int) -> int:
        """Start accepting connections; returns the bound port."""
        self._server = await serve(host, port, self._on_channel, self.name)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close_connections(self) -> None:
        if self._server is not None:
            self._server.close()
        for channel in list(self._requests_of):
            await channel.close()

    async def handle(self, channel: Channel, message: Message) -> None:
        raise NotImplementedError

    async def abort_request(self, request_id: str) -> None:
        raise NotImplementedError

    def track(self, channel: Channel, request_id: str) -> None:
        self._requests_of.setdefault(channel, set()).add(request_id)

    def untrack(self, channel: Channel, request_id: str) -> None:
        self._requests_of.get(channel, set()).discard(request_id)
        self._untracked.set()

    @property
    def num_tracked(self) -> int:
        return sum(len(ids) for ids in self._requests_of.values())

    async def end_channel(self, channel: Channel, reason: str) -> None:
        """Abort every request that arrived through `channel`, waiting for each abort (writes
        to peers end first), then close it."""
        log.warning("%s: ending connection %s: %s", self.name, channel.name, reason)
        for request_id in self._requests_of.pop(channel, set()):
            await self.abort_request(request_id)
        await channel.close()

    async def drain(self, deadline_s: float) -> bool:
        """Stop accepting connections and requests, then wait up to `deadline_s` for the
        requests under way to finish; returns True if none is left (the caller aborts the
        rest by closing)."""
        self.accepting = False
        if self._server is not None:
            self._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        while self.busy():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._untracked.clear()
            try:
                await asyncio.wait_for(self._untracked.wait(), left)
            except TimeoutError:
                return not self.busy()
        return True

    def busy(self) -> bool:
        """Whether requests are under way (subclasses add what else they hold)."""
        return self.num_tracked > 0

    @staticmethod
    def refuse_hello(channel: Channel, message: Hello) -> bool:
        """Answer a Hello of another protocol version with an error; True if refused."""
        if message.protocol_version == PROTOCOL_VERSION:
            return False
        channel.reply(message, CallError(message=f"protocol_version: {message.protocol_version} != "
                                                 f"{PROTOCOL_VERSION}", kind="invalid"))
        return True

    def _on_channel(self, channel: Channel) -> None:
        self._requests_of[channel] = set()
        channel.set_handler(self.handle)
        asyncio.get_running_loop().create_task(self._abort_when_closed(channel))

    async def _abort_when_closed(self, channel: Channel) -> None:
        await channel.closed.wait()
        for request_id in self._requests_of.pop(channel, set()):
            await self.abort_request(request_id)
        self._untracked.set()
