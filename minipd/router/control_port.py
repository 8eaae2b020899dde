"""The router's control port: clients send requests here, and instances register here.

Every peer first completes the handshake (`minipd.control.handshake`; with a cluster
secret, it must prove it). Clients (`role=Role.CLIENT`) then send `ClientGenerate`
(answered by a stream of `TokenOutput` ending with a finished one; a refused request ends
at once with `error` set; the prompt is tokenized on a worker thread, off the loop),
`Abort`, and `GetStats` (answered by `ClusterStats`). Instances (an instance role) send
`Register(host, port)`; the router connects back, handshakes (so the instance must prove the
secret too) and answers `Registered` or `CallError` (e.g. a fingerprint mismatch, saying
what differs). Any other message from a role is refused. A client's requests are aborted
when its connection drops.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from minipd.control.channel import Channel
from minipd.control.handshake import AuthenticationError
from minipd.control.limits import DEFAULT_MAX_CONNECTIONS, max_frame_bytes
from minipd.control.messages import (
    Abort,
    CallError,
    ClientGenerate,
    ClusterStats,
    GetStats,
    Hello,
    Message,
    Register,
    Registered,
    TokenOutput,
    Welcome,
)
from minipd.control.role import Role
from minipd.control.server import ControlServer
from minipd.engine.request import RequestOutput
from minipd.engine.sampling_params import InvalidRequestError
from minipd.router.registry import IncompatibleInstance
from minipd.router.router import Router

log = logging.getLogger(__name__)


CLIENT_MESSAGES = (ClientGenerate, Abort, GetStats)


class RouterControlPort(ControlServer):
    def __init__(self, router: Router, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        super().__init__("router", router.secret, max_connections)
        self.router = router
        self._tokenizing: dict[str, bool] = {}  # request id -> aborted meanwhile
        self._client_numbers: dict[Channel, int] = {}
        self._next_client = itertools.count()

    async def close(self) -> None:
        await self.close_connections()

    async def abort_request(self, request_id: str) -> None:
        self.router.abort(request_id)

    def welcome(self, hello: Hello) -> Welcome:
        return Welcome(
            instance_id="router",
            role=Role.ROUTER,
            fingerprint=self.router.registry.fingerprint,
            model_name=self.router.model_name,
            max_model_len=self.router.max_model_len,
        )

    def refuses_role(self, role: Role) -> str | None:
        if role is Role.CLIENT or role.is_instance:
            return None
        return f"the router's port serves clients and instances, not a {role.value}"

    def max_frame_bytes(self) -> int:
        return max_frame_bytes(self.router.max_model_len)

    async def handle(self, channel: Channel, message: Message) -> None:
        role = channel.peer_role
        if isinstance(message, CLIENT_MESSAGES) and role is not Role.CLIENT:
            self.refuse(channel, message, f"a {role.value} may not send {type(message).__name__}; only clients may")
            return
        match message:
            case Register() if not role.is_instance:
                self.refuse(channel, message, f"a {role.value} may not register as an instance")
            case Register():
                try:
                    handle = await self.router.add_instance(message.host, message.port, expected_role=role)
                except (IncompatibleInstance, AuthenticationError, ConnectionError, OSError, TimeoutError) as exc:
                    log.error("refused instance at %s:%d: %s", message.host, message.port, exc)
                    channel.reply(message, CallError(message=str(exc), kind="invalid"))
                else:
                    channel.reply(message, Registered(instance_id=handle.instance_id))
            case ClientGenerate():
                await self._generate(channel, message)
            case Abort():
                request_id = self._scoped(channel, message.request_id)
                if request_id in self._tokenizing:
                    self._tokenizing[request_id] = True
                self.router.abort(request_id)
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
        self._tokenizing[request_id] = False
        try:
            params = message.sampling
            if self.router.registry.instances:  # else submit says there is none
                # the request's one validation, off the loop; the router checks invariants only
                prompt = await self.router.prompt_encoder.check(
                    prompt, params, self.router.vocab_size, self.router.max_model_len
                )
                params = None
            aborted = self._tokenizing.get(request_id, False)
            stream = None if aborted else self.router.submit(prompt, params, request_id, layerwise=message.layerwise)
        except (InvalidRequestError, RuntimeError) as exc:  # NoCapacity included
            channel.send(
                TokenOutput(request_id=message.request_id, output=RequestOutput.aborted(message.request_id, str(exc)))
            )
            return
        finally:
            self._tokenizing.pop(request_id, None)
        if stream is None:  # the client aborted it while it was being tokenized
            channel.send(
                TokenOutput(request_id=message.request_id, output=RequestOutput.aborted(message.request_id, None))
            )
            return
        self.track(channel, request_id)
        try:
            async with stream:
                async for output in stream:
                    output.request_id = message.request_id
                    channel.send(TokenOutput(request_id=message.request_id, output=output))
        finally:
            self.untrack(channel, request_id)
