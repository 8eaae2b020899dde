"""A Python client for a running cluster (the router's control port).

    client = await ClusterClient.connect("127.0.0.1", 8100, secret=os.environ.get("MINIPD_CLUSTER_SECRET"))
    async for out in client.generate("Hello", SamplingParams(max_tokens=8)):
        print(out.text, end="")
    await client.close()

A router started with a cluster secret serves only clients that prove it (`secret`); a
request too large for the router's frame cap raises `InvalidRequestError` on `submit`.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Sequence

from minipd.control.channel import Channel, FrameTooLarge
from minipd.control.handshake import SharedSecret, open_channel
from minipd.control.messages import Abort, ClientGenerate, ClusterStats, GetStats, Message, Stats, TokenOutput, Welcome
from minipd.control.role import Role
from minipd.engine.generator import GeneratesFromSubmit
from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams


class ClusterClient(GeneratesFromSubmit):
    def __init__(self, channel: Channel, welcome: Welcome):
        self.channel = channel
        self.welcome = welcome
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count()

    @classmethod
    async def connect(
        cls, host: str, port: int, timeout: float = 30.0, secret: SharedSecret | str | None = None
    ) -> "ClusterClient":
        """Connect and handshake; `secret` is the cluster secret (text or a SharedSecret) when
        the router has one. Raises AuthenticationError when the secrets do not match."""
        if isinstance(secret, str):
            secret = SharedSecret.from_text(secret)
        channel, welcome = await open_channel(host, port, None, f"client->{host}:{port}", Role.CLIENT, secret, timeout)
        client = cls(channel, welcome)
        channel.set_handler(client._on_message)
        asyncio.get_running_loop().create_task(client._fail_when_closed())
        return client

    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        layerwise: bool | None = None,
    ) -> RequestStream:
        """Send a request; the stream yields its outputs (the router's refusals arrive as a
        finished output with `error`; engine/generator.py), and so does the connection to it
        being lost, before or after the request left. `request_id` is unique among this
        client's live requests (None: numbered here); `layerwise` overrides the router's KV
        streaming mode for this request."""
        request_id = request_id if request_id is not None else f"c{next(self._ids)}"
        if request_id in self._streams:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        stream = RequestStream(request_id, self._abort)
        if self.channel.closed.is_set():  # the router is gone: say so now, not after a wait for nothing
            stream.put(RequestOutput.aborted(request_id, f"connection lost: {self.channel.close_reason}"))
            return stream
        self._streams[request_id] = stream
        text, ids = (prompt, None) if isinstance(prompt, str) else (None, list(prompt))
        try:
            self.channel.send(
                ClientGenerate(
                    request_id=request_id,
                    prompt=text,
                    token_ids=ids,
                    sampling=params or SamplingParams(),
                    layerwise=layerwise,
                )
            )
        except FrameTooLarge as exc:
            del self._streams[request_id]
            raise InvalidRequestError("prompt", f"too large to send: {exc}") from None
        return stream

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
