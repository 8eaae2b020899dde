"""Base of the control-plane servers (instances and the router's client port).

It accepts connections, remembers which requests arrived through each, and aborts those
when the connection drops, so a vanished router or client never leaves work behind.
"""

from __future__ import annotations

import asyncio

from minipd.control.channel import Channel, serve
from minipd.control.messages import PROTOCOL_VERSION, CallError, Hello, Message


class ControlServer:
    def __init__(self, name: str):
        self.name = name
        self.port = 0
        self._server: asyncio.Server | None = None
        self._requests_of: dict[Channel, set[str]] = {}

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
