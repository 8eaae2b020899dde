"""Base of the control-plane servers (instances and the router's client port).

It accepts connections (at most `max_connections`; see `ConnectionSlots`), runs the server
side of the handshake (`handshake.py`) before anything else is read, remembers which
requests arrived through each connection (`track`, `untrack`: connection_requests.py), and
aborts those when the connection drops, so a vanished router or client never leaves work
behind. A connection this end gives up on (its
peer went silent, or evicted us) is ended the other way round: its requests are aborted
first, then it is closed, so that whoever watches the connection knows, once it closes, that
nothing of ours is still writing for it.

Until its handshake is done a connection may send only `Hello` and `Prove`, in frames of
at most HANDSHAKE_MAX_FRAME_BYTES, within HANDSHAKE_TIMEOUT_S; anything else, a role this
server does not serve (`refuses_role`), or a wrong proof is answered with
`CallError(kind="auth")` and the connection is closed. Subclasses implement `welcome`,
`refuses_role`, `max_frame_bytes`, `handle`, optionally `established`, (which only ever sees messages of authenticated
peers, whose role is `channel.peer_role`) and `abort_request`.

Shutdown (`drain`): stop accepting connections, let the requests under way finish until a
deadline, and say whether any were left to abort.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from minipd.control.channel import Channel, serve
from minipd.control.connection_requests import ConnectionRequests
from minipd.control.handshake import SECRET_HINT, client_proof_ok, server_proof
from minipd.control.limits import DEFAULT_MAX_CONNECTIONS, HANDSHAKE_TIMEOUT_S
from minipd.control.messages import PROTOCOL_VERSION, Call, CallError, Challenge, Hello, Message, Prove, Welcome
from minipd.control.role import Role
from minipd.transports.connection_slots import ConnectionSlots
from minipd.transports.shared_secret import NONCE_BYTES, SharedSecret, new_nonce

log = logging.getLogger(__name__)


class _Pending(NamedTuple):
    """A connection whose handshake is under way: its Hello, and our nonce once challenged."""

    hello: Hello
    nonce: bytes


class ControlServer(ConnectionRequests):
    def __init__(self, name: str, secret: SharedSecret | None = None, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        self.name = name
        self.secret = secret
        self.port = 0
        self.accepting = True  # False once draining: new requests are refused
        self._server: asyncio.Server | None = None
        self._requests_of: dict[Channel, set[str]] = {}
        self._pending: dict[Channel, _Pending] = {}
        self._slots: ConnectionSlots[Channel] = ConnectionSlots(max_connections, f"{name} control port")
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

    # ---- for subclasses ---------------------------------------------------------------
    def welcome(self, hello: Hello) -> Welcome:
        """The Welcome an authenticated peer (who said `hello`) receives."""
        raise NotImplementedError

    def established(self, channel: Channel, hello: Hello) -> None:
        """Called once a peer is authenticated and welcomed (for heartbeats and such)."""

    def refuses_role(self, role: Role) -> str | None:
        """Why a peer of `role` may not connect here, or None if it may."""
        raise NotImplementedError

    def max_frame_bytes(self) -> int:
        """The frame cap of an authenticated connection."""
        raise NotImplementedError

    async def handle(self, channel: Channel, message: Message) -> None:
        raise NotImplementedError

    async def abort_request(self, request_id: str) -> None:
        raise NotImplementedError

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
    def refuse(channel: Channel, message: Message, reason: str) -> None:
        """Answer a message this peer may not send (a call gets a CallError); the connection stays."""
        log.warning("%s: refused %s: %s", channel.name, type(message).__name__, reason)
        if isinstance(message, Call):
            channel.reply(message, CallError(message=reason, kind="auth"))

    # ---- connections and the handshake ------------------------------------------------
    def _on_channel(self, channel: Channel) -> None:
        admitted, evicted = self._slots.admit(channel)
        if not admitted:
            channel.drop(f"connection limit of {self._slots.limit} reached")
            return
        if evicted is not None:
            evicted.drop("closed to make room: no handshake yet")
        self._requests_of[channel] = set()
        channel.set_handler(self._gate)
        loop = asyncio.get_running_loop()
        loop.create_task(self._abort_when_closed(channel))
        loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_expired, channel)

    def _gate(self, channel: Channel, message: Message):
        """A connection's handler until its handshake is done (then `handle` is): only the
        handshake's messages are taken."""
        if channel.peer_role is not None:  # established meanwhile
            return self.handle(channel, message)
        pending = self._pending.get(channel)
        if isinstance(message, Hello) and pending is None:
            self._on_hello(channel, message)
        elif isinstance(message, Prove) and pending is not None and pending.nonce:
            self._on_prove(channel, message, pending)
        else:
            self._fail_handshake(channel, message, f"{type(message).__name__} before the handshake completed")
        return None

    def _on_hello(self, channel: Channel, hello: Hello) -> None:
        if hello.protocol_version != PROTOCOL_VERSION:
            self._fail_handshake(channel, hello, f"protocol_version: {hello.protocol_version} != {PROTOCOL_VERSION}")
            return
        refused = self.refuses_role(hello.role)
        if refused is not None:
            self._fail_handshake(channel, hello, refused)
            return
        if self.secret is None:
            self._establish(channel, hello, hello, None)
            return
        if len(hello.nonce) != NONCE_BYTES:
            self._fail_handshake(
                channel,
                hello,
                f"{self.name} requires the cluster secret and the peer sent no challenge nonce; {SECRET_HINT}",
            )
            return
        nonce = new_nonce()
        self._pending[channel] = _Pending(hello, nonce)
        channel.reply(hello, Challenge(nonce=nonce))

    def _on_prove(self, channel: Channel, prove: Prove, pending: _Pending) -> None:
        hello = pending.hello
        if not client_proof_ok(self.secret, prove.proof, hello.role, hello.nonce, pending.nonce):
            self._fail_handshake(
                channel,
                prove,
                f"wrong proof of the cluster secret: the secrets of {self.name} and the peer differ; {SECRET_HINT}",
            )
            return
        del self._pending[channel]
        self._establish(channel, hello, prove, pending.nonce)

    def prove(self, welcome: Welcome, hello: Hello, server_nonce: bytes) -> bytes:
        """Our proof of the cluster secret, over the handshake's nonces and who `welcome` says we are."""
        return server_proof(
            self.secret, hello.role, hello.nonce, server_nonce, welcome.instance_id, welcome.start_nonce
        )

    def _establish(self, channel: Channel, hello: Hello, call: Call, server_nonce: bytes | None) -> None:
        """Welcome an authenticated peer (`server_nonce`: our challenge's; None: no secret, no proof)."""
        channel.peer_role = hello.role
        channel.max_frame_bytes = channel.max_send_bytes = self.max_frame_bytes()
        self._slots.establish(channel)
        welcome = self.welcome(hello)
        welcome.proof = b"" if server_nonce is None else self.prove(welcome, hello, server_nonce)
        channel.reply(call, welcome)
        channel.set_handler(self.handle)  # authenticated: its messages go straight to `handle`
        self.established(channel, hello)

    def _fail_handshake(self, channel: Channel, message: Message, reason: str) -> None:
        log.warning("%s: refusing %s: %s", self.name, channel.name, reason)
        if isinstance(message, Call):
            channel.reply(message, CallError(message=reason, kind="auth"))
        channel.drop(f"handshake failed: {reason}")

    def _handshake_expired(self, channel: Channel) -> None:
        if channel.peer_role is None and not channel.closed.is_set():
            channel.drop(f"no handshake within {HANDSHAKE_TIMEOUT_S} s")

    async def _abort_when_closed(self, channel: Channel) -> None:
        await channel.closed.wait()
        self._slots.release(channel)
        self._pending.pop(channel, None)
        for request_id in self._requests_of.pop(channel, set()):
            await self.abort_request(request_id)
        self._untracked.set()
