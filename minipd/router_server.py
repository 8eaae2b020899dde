"""The router's control port: clients send requests here, and instances register here.

Clients: `Hello(role="client")`, then `ClientGenerate` (answered by a stream of `TokenOutput`
ending with a finished one; a refused request ends at once with `error` set), `Abort`, and
`GetStats` (answered by `ClusterStats`). Instances: `Register(host, port)`; the router
connects back, handshakes and answers `Registered` or `CallError` (e.g. a fingerprint
mismatch, saying what differs). A client's requests are aborted when its connection drops.
"""

from __future__ import annotations

import asyncio
import logging

from .control.channel import Channel, serve
from .control.messages import (PROTOCOL_VERSION, Abort, CallError, ClientGenerate, ClusterStats, GetStats, Hello,
                               Message, Register, Registered, TokenOutput, Welcome)
from .instance_registry import IncompatibleInstance
from .request import FinishReason, RequestOutput
from .router import Router
from .sampling_params import InvalidRequestError

log = logging.getLogger(__name__)


class RouterServer:
    def __init__(self, router: Router):
        self.router = router
        self._server: asyncio.Server | None = None
        self._requests_of: dict[Channel, set[str]] = {}
        self.port = 0

    async def serve(self, host: str, port: int) -> int:
        self._server = await serve(host, port, self._on_channel, "router")
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for channel in list(self._requests_of):
            await channel.close()

    def _on_channel(self, channel: Channel) -> None:
        self._requests_of[channel] = set()
        channel.set_handler(self._handle)
        asyncio.get_running_loop().create_task(self._abort_when_closed(channel))

    async def _abort_when_closed(self, channel: Channel) -> None:
        await channel.closed.wait()
        for request_id in self._requests_of.pop(channel, set()):
            self.router.abort(request_id)

    async def _handle(self, channel: Channel, message: Message) -> None:
        match message:
            case Hello():
                if message.protocol_version != PROTOCOL_VERSION:
                    channel.reply(message, CallError(message=f"protocol_version: {message.protocol_version} != "
                                                             f"{PROTOCOL_VERSION}", kind="invalid"))
                    return
                channel.reply(message, Welcome(instance_id="router", role="router",
                                               fingerprint=self.router.registry.fingerprint,
                                               model_name=self.router.model_name,
                                               max_model_len=self.router.max_model_len))
            case Register():
                try:
                    handle = await self.router.add_instance(message.host, message.port)
                except (IncompatibleInstance, ConnectionError, OSError, TimeoutError) as exc:
                    log.error("refused instance at %s:%d: %s", message.host, message.port, exc)
                    channel.reply(message, CallError(message=str(exc), kind="invalid"))
                else:
                    channel.reply(message, Registered(instance_id=handle.instance_id))
            case ClientGenerate():
                await self._generate(channel, message)
            case Abort():
                self.router.abort(self._scoped(channel, message.request_id))
            case GetStats():
                channel.reply(message, ClusterStats(instances=await self.router.refresh_stats(message.settle)))
            case _:
                log.warning("router: unexpected %s from %s", type(message).__name__, channel.name)

    @staticmethod
    def _scoped(channel: Channel, request_id: str) -> str:
        """Client request ids are only unique per connection; the router's are global."""
        return f"{id(channel):x}:{request_id}"

    async def _generate(self, channel: Channel, message: ClientGenerate) -> None:
        request_id = self._scoped(channel, message.request_id)
        prompt = message.prompt if message.prompt is not None else (message.token_ids or [])
        try:
            stream = self.router.submit(prompt, message.sampling, request_id)
        except (InvalidRequestError, RuntimeError) as exc:
            channel.send(TokenOutput(request_id=message.request_id, output=RequestOutput(
                request_id=message.request_id, token_ids=[], text="", finished=True,
                finish_reason=FinishReason.ABORT.value, error=str(exc))))
            return
        self._requests_of[channel].add(request_id)
        try:
            async with stream:
                async for output in stream:
                    output.request_id = message.request_id
                    channel.send(TokenOutput(request_id=message.request_id, output=output))
        finally:
            self._requests_of.get(channel, set()).discard(request_id)
