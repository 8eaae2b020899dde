"""The router's control port: clients send requests here, and instances register here.

Clients: `Hello(role=Role.CLIENT)`, then `ClientGenerate` (answered by a stream of `TokenOutput`
ending with a finished one; a refused request ends at once with `error` set), `Abort`, and
`GetStats` (answered by `ClusterStats`). Instances: `Register(host, port)`; the router
connects back, handshakes and answers `Registered` or `CallError` (e.g. a fingerprint
mismatch, saying what differs). A client's requests are aborted when its connection drops.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from minipd.control.channel import Channel
from minipd.control.messages import (Abort, CallError, ClientGenerate, ClusterStats, GetStats, Hello,
                               Message, Register, Registered, TokenOutput, Welcome)
from minipd.control.role import Role
from minipd.control.server import ControlServer
from minipd.router.registry import IncompatibleInstance
from minipd.engine.request import RequestOutput
from minipd.router.router import Router
from minipd.engine.sampling_params import InvalidRequestError

log = logging.getLogger(__name__)


class RouterControlPort(ControlServer):
    def __init__(self, router: Router):
        super().__init__("router")
        self.router = router
        self._client_numbers: dict[Channel, int] = {}
        self._next_client = itertools.count()

    async def close(self) -> None:
        await self.close_connections()

    async def abort_request(self, request_id: str) -> None:
        self.router.abort(request_id)

    async def handle(self, channel: Channel, message: Message) -> None:
        match message:
            case Hello():
                if self.refuse_hello(channel, message):
                    return
                channel.reply(message, Welcome(instance_id="router", role=Role.ROUTER,
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

    def _scoped(self, channel: Channel, request_id: str) -> str:
        """Client request ids are only unique per connection; the router's are global (and
        never reused: instances remember ids of aborted requests)."""
        number = self._client_numbers.get(channel)
        if number is None:
            number = self._client_numbers[channel] = next(self._next_client)
            asyncio.get_running_loop().create_task(self._forget_client(channel))
        return f"client{number}:{request_id}"

    async def _forget_client(self, channel: Channel) -> None:
        await channel.closed.wait()
        self._client_numbers.pop(channel, None)

    async def _generate(self, channel: Channel, message: ClientGenerate) -> None:
        request_id = self._scoped(channel, message.request_id)
        prompt = message.prompt if message.prompt is not None else (message.token_ids or [])
        try:
            stream = self.router.submit(prompt, message.sampling, request_id, message.layerwise)
        except (InvalidRequestError, RuntimeError) as exc:
            channel.send(TokenOutput(request_id=message.request_id,
                                     output=RequestOutput.aborted(message.request_id, str(exc))))
            return
        self.track(channel, request_id)
        try:
            async with stream:
                async for output in stream:
                    output.request_id = message.request_id
                    channel.send(TokenOutput(request_id=message.request_id, output=output))
        finally:
            self.untrack(channel, request_id)
