"""A Python client for a running cluster (the router's control port).

    client = await ClusterClient.connect("127.0.0.1", 8100)
    async for out in client.generate("Hello", SamplingParams(max_tokens=8)):
        print(out.text, end="")
    await client.close()
"""

from __future__ import annotations

import asyncio
import itertools
from typing import AsyncIterator, Sequence

from minipd.control.channel import Channel
from minipd.control.role import Role
from minipd.control.messages import (PROTOCOL_VERSION, Abort, ClientGenerate, ClusterStats, GetStats, Hello, Message,
                               Stats, TokenOutput, Welcome)
from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import SamplingParams


class ClusterClient:
    def __init__(self, channel: Channel, welcome: Welcome):
        self.channel = channel
        self.welcome = welcome
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count()

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 30.0) -> "ClusterClient":
        channel = await Channel.connect(host, port, None, f"client->{host}:{port}", timeout)
        welcome = await channel.call(Hello(protocol_version=PROTOCOL_VERSION, role=Role.CLIENT), timeout)
        client = cls(channel, welcome)
        channel.set_handler(client._on_message)
        asyncio.get_running_loop().create_task(client._fail_when_closed())
        return client

    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
               layerwise: bool | None = None) -> RequestStream:
        """Send a request; the stream yields its outputs (errors arrive as a finished output with `error`).
        `layerwise` overrides the router's KV streaming mode for this request."""
        request_id = f"c{next(self._ids)}"
        stream = RequestStream(request_id, self._abort)
        self._streams[request_id] = stream
        text, ids = (prompt, None) if isinstance(prompt, str) else (None, list(prompt))
        self.channel.send(ClientGenerate(request_id=request_id, prompt=text, token_ids=ids,
                                         sampling=params or SamplingParams(), layerwise=layerwise))
        return stream

    async def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                       layerwise: bool | None = None) -> AsyncIterator[RequestOutput]:
        async with self.submit(prompt, params, layerwise) as stream:
            async for output in stream:
                yield output

    async def stats(self, settle: bool = False, timeout: float = 30.0) -> list[Stats]:
        """Every live instance's stats; `settle` waits (bounded) for aborts to land first."""
        reply: ClusterStats = await self.channel.call(GetStats(settle=settle), timeout)
        return reply.instances

    async def close(self) -> None:
        await self.channel.close()

    def _abort(self, request_id: str) -> bool:
        self.channel.send(Abort(request_id=request_id))
        return True

    def _on_message(self, channel: Channel, message: Message) -> None:
        if isinstance(message, TokenOutput):
            stream = self._streams.get(message.request_id)
            if stream is not None:
                if message.output.finished:
                    del self._streams[message.request_id]
                stream.put(message.output)

    async def _fail_when_closed(self) -> None:
        await self.channel.closed.wait()
        for request_id, stream in list(self._streams.items()):
            stream.put(RequestOutput.aborted(request_id, f"connection lost: {self.channel.close_reason}"))
        self._streams.clear()
