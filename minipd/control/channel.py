"""A control-plane connection: length-prefixed msgpack frames over an asyncio stream.

Frame: 4-byte big-endian length, then one msgpack-encoded `AnyMessage`. Frames above
`max_frame_bytes` or that do not decode as a known message close the connection with a
logged reason (the peer is broken or hostile; nothing from it is trusted afterwards). The
caps come from `limits.py`: a server reads handshake-sized frames until its peer has
authenticated (`handshake.py`), then frames sized for the peers' max_model_len. Sending a
frame above `max_send_bytes` raises `FrameTooLarge` and leaves the connection up; a peer
that lets more than MAX_WRITE_BUFFER_BYTES queue up unread is disconnected.

A `Channel` multiplexes many requests: `call()` sends a `Call` and waits, with a timeout, for
the `Reply` carrying the same `call_id`; every other incoming message goes to the handler.
When the connection ends, pending calls fail with `ChannelClosed` and `closed` is set.

Liveness (`watch_liveness`): both ends send a `Heartbeat` a few times per liveness timeout,
and an end that hears nothing at all for its timeout calls `on_silent` (by default it closes
the connection). A tick that runs late (this process was frozen, or its loop blocked) does not
judge the peer: its frames may be waiting unread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import time
from typing import Awaitable, Callable

import msgspec

from minipd.control.limits import HANDSHAKE_MAX_FRAME_BYTES, MAX_WRITE_BUFFER_BYTES, max_frame_bytes
from minipd.control.messages import AnyMessage, Call, CallError, Heartbeat, Message, Reply
from minipd.control.role import Role

log = logging.getLogger(__name__)

HEADER = struct.Struct(">I")
# Until the handshake says the peers' max_model_len: room for a Welcome and its description.
DEFAULT_MAX_FRAME_BYTES = max_frame_bytes(0)
DEFAULT_CALL_TIMEOUT_S = 30.0
HEARTBEATS_PER_TIMEOUT = 4  # a peer misses this many heartbeats in a row before it is declared dead
DEFAULT_LIVENESS_TIMEOUT_S = 5.0

Handler = Callable[["Channel", Message], Awaitable[None] | None]


class ChannelClosed(ConnectionError):
    """The connection ended (or was refused) before a reply arrived."""


class FrameTooLarge(ValueError):
    """A message to send encodes to more than the peer accepts; nothing was sent."""


class RemoteError(RuntimeError):
    """The peer answered a call with `CallError`."""

    def __init__(self, error: CallError):
        super().__init__(error.message)
        self.kind = error.kind


class Channel:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Handler | None,
        name: str,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ):
        self.name = name
        self._reader, self._writer = reader, writer
        self._handler = handler
        self.max_frame_bytes = max_frame_bytes  # read side; raised once the peer is authenticated
        self.max_send_bytes: int | None = None  # what the peer reads, once the handshake told us
        self.peer_role: Role | None = None  # set by the handshake, on both ends
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(AnyMessage)
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count(1)
        self._handler_tasks: set[asyncio.Task] = set()
        self.closed = asyncio.Event()
        self.close_reason = ""
        self._reader_task: asyncio.Task | None = None
        self.last_received = time.monotonic()  # when the latest frame arrived
        self._liveness_task: asyncio.Task | None = None

    @classmethod
    async def connect(
        cls, host: str, port: int, handler: Handler | None, name: str, timeout: float = DEFAULT_CALL_TIMEOUT_S
    ) -> "Channel":
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        channel = cls(reader, writer, handler, name)
        channel.start()
        return channel

    def start(self) -> None:
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop(), name=f"channel-{self.name}")

    def set_handler(self, handler: Handler) -> None:
        self._handler = handler

    # ---- sending ----------------------------------------------------------------------
    def send(self, message: Message) -> None:
        """Queue a message for sending (ordered); a closed channel drops it with a debug log,
        and so does one whose transport is already closed while its read loop has not yet seen
        the end (uvloop raises on that write: a sender such as the router telling every peer of a
        loss must not die of it, or what it does next, the loss's redial, never happens).
        Raises FrameTooLarge (sending nothing) if it encodes above `max_send_bytes`."""
        if self.closed.is_set() or self._writer.transport.is_closing():
            log.debug("%s: dropping %s on a closed channel", self.name, type(message).__name__)
            return
        payload = self._encoder.encode(message)
        if self.max_send_bytes is not None and len(payload) > self.max_send_bytes:
            raise FrameTooLarge(
                f"{type(message).__name__} of {len(payload)} bytes exceeds the "
                f"{self.max_send_bytes}-byte frame cap of {self.name}"
            )
        self._writer.write(HEADER.pack(len(payload)) + payload)
        queued = self._writer.transport.get_write_buffer_size()
        if queued > MAX_WRITE_BUFFER_BYTES:
            self._shutdown(f"the peer is not reading: {queued} bytes queued for it")

    async def call(self, message: Call, timeout: float = DEFAULT_CALL_TIMEOUT_S) -> Reply:
        """Send `message` and return its reply; raises RemoteError, ChannelClosed or TimeoutError."""
        if self.closed.is_set():
            raise ChannelClosed(f"{self.name}: closed ({self.close_reason})")
        message.call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[message.call_id] = future
        try:
            self.send(message)
            reply = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{self.name}: no reply to {type(message).__name__} within {timeout} s") from None
        finally:
            self._calls.pop(message.call_id, None)
        if isinstance(reply, CallError):
            raise RemoteError(reply)
        return reply

    def reply(self, call: Call, reply: Reply) -> None:
        reply.call_id = call.call_id
        reply.request_id = call.request_id
        self.send(reply)

    def fail_calls(self, reason: str) -> None:
        """Fail every pending call with ChannelClosed (the peer was declared dead) while the
        connection itself stays open."""
        for future in self._calls.values():
            if not future.done():
                future.set_exception(ChannelClosed(f"{self.name}: {reason}"))

    # ---- liveness -----------------------------------------------------------------------
    def watch_liveness(
        self, timeout_s: float, peer_timeout_s: float, on_silent: Callable[[str], None] | None = None
    ) -> None:
        """Heartbeat often enough for both ends' timeouts, and call `on_silent(reason)` once
        (default: close the connection) if nothing arrives for `timeout_s`; then stop both."""
        interval = min(timeout_s, peer_timeout_s or timeout_s) / HEARTBEATS_PER_TIMEOUT
        on_silent = on_silent or self._shutdown
        self._liveness_task = asyncio.get_running_loop().create_task(
            self._watch(interval, timeout_s, on_silent), name=f"liveness-{self.name}"
        )

    async def _watch(self, interval: float, timeout_s: float, on_silent: Callable[[str], None]) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + interval
        while not self.closed.is_set():
            await asyncio.sleep(max(0.0, due - loop.time()))  # the heartbeat period
            late = loop.time() - due
            due = loop.time() + interval
            self.send(Heartbeat())
            if late > interval:
                continue  # we did not run for a while: the peer's frames may be unread, judge next time
            silent_s = time.monotonic() - self.last_received
            if silent_s > timeout_s:
                on_silent(f"no frame from the peer for {silent_s:.1f} s (liveness timeout {timeout_s} s)")
                return

    # ---- receiving --------------------------------------------------------------------
    async def _read_loop(self) -> None:
        reason = "peer closed the connection"
        try:
            while True:
                header = await self._reader.readexactly(HEADER.size)
                (length,) = HEADER.unpack(header)
                if length > self.max_frame_bytes:
                    reason = f"frame of {length} bytes exceeds the {self.max_frame_bytes}-byte cap"
                    break
                payload = await self._reader.readexactly(length)
                self.last_received = time.monotonic()
                try:
                    message = self._decoder.decode(payload)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    reason = f"malformed message: {exc}"
                    break
                self._dispatch(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            reason = "closed locally"
        finally:
            self._shutdown(reason)

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, Heartbeat):
            return  # its arrival was the point
        if isinstance(message, Reply) and message.call_id:
            future = self._calls.get(message.call_id)
            if future is None:
                log.debug("%s: late %s (its call already failed or timed out)", self.name, type(message).__name__)
            elif not future.done():
                future.set_result(message)
            return
        if self._handler is None:
            log.warning("%s: no handler for %s", self.name, type(message).__name__)
            return
        result = self._handler(self, message)
        if asyncio.iscoroutine(result):
            task = asyncio.get_running_loop().create_task(self._run_handler(result, message))
            self._handler_tasks.add(task)
            task.add_done_callback(self._handler_tasks.discard)

    async def _run_handler(self, coro, message: Message) -> None:
        try:
            await coro
        except Exception as exc:  # a failing handler must not take the connection down
            log.exception("%s: handling %s failed", self.name, type(message).__name__)
            if isinstance(message, Call):
                self.reply(message, CallError(message=f"internal error: {type(exc).__name__}: {exc}"))

    # ---- closing ----------------------------------------------------------------------
    def drop(self, reason: str) -> None:
        """Close now (what was sent already still goes out), logging `reason`."""
        self._shutdown(reason)

    def _shutdown(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        if reason not in ("peer closed the connection", "closed locally"):
            log.warning("%s: closing connection: %s", self.name, reason)
        self.closed.set()
        self.fail_calls(reason)
        if self._liveness_task is not None and self._liveness_task is not asyncio.current_task():
            self._liveness_task.cancel()
        self._writer.close()

    async def close(self) -> None:
        if self._reader_task is not None and not self._reader_task.done():
            self._reader_task.cancel()
            try:
                await self._reader_task
            except asyncio.CancelledError:
                pass
        self._shutdown("closed locally")
        for task in list(self._handler_tasks):
            task.cancel()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def serve(host: str, port: int, on_channel: Callable[[Channel], None], name: str) -> asyncio.Server:
    """Accept connections; each becomes a Channel reading handshake-sized frames, handed to
    `on_channel` (which sets its handler, or drops it), then started."""

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        channel = Channel(reader, writer, None, f"{name}<-{peer}", HANDSHAKE_MAX_FRAME_BYTES)
        on_channel(channel)
        if not channel.closed.is_set():
            channel.start()

    return await asyncio.start_server(accepted, host, port)
