"""The sending end of one tcp link: scatter-gather writes straight from the source blocks."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Sequence

from minipd.transports.messages import Hello, Message, message_encoder
from minipd.transports.tcp_receiver import PREFIX

logger = logging.getLogger(__name__)

# sendmsg takes at most IOV_MAX buffers per call.
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
# A larger send buffer keeps the kernel busy while the loop wakes up.
SEND_BUFFER_BYTES = 4 << 20


class TcpLink:
    """One outgoing connection to a receiver. Frames are sent whole and in call order (a
    lock serialises them); payload buffers are memoryviews of the pool, handed to `sendmsg`
    together with the header, so nothing is copied in user space. `on_lost` is called once
    when the receiver closes the connection or it breaks."""

    def __init__(self, sock: socket.socket, peer_id: str, on_lost: Callable[[str, str], None]) -> None:
        self._sock = sock
        self.peer_id = peer_id
        self._on_lost = on_lost
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._lost_reason: str | None = None
        # The receiver never sends; readability means it closed the link or it broke.
        self._loop.add_reader(sock.fileno(), self._on_readable)

    @classmethod
    async def open(cls, host: str, port: int, hello: Hello, peer_id: str,
                   on_lost: Callable[[str, str], None]) -> TcpLink:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        try:
            await loop.sock_connect(sock, (host, port))
        except OSError:
            sock.close()
            raise
        link = cls(sock, peer_id, on_lost)
        await link.send(hello, ())
        return link

    async def send(self, message: Message, payload: Sequence[memoryview]) -> None:
        """Send one frame: `message` as the header, then the payload buffers in order. Raises
        ConnectionError if the link is or goes down."""
        header = message_encoder.encode(message)
        buffers = [memoryview(PREFIX.pack(len(header)) + header), *payload]
        async with self._lock:
            if self._lost_reason is not None:
                raise ConnectionError(self._lost_reason)
            await self._send_all(buffers)

    async def _send_all(self, buffers: list[memoryview]) -> None:
        index = 0
        while index < len(buffers):
            try:
                sent = self._sock.sendmsg(buffers[index:index + IOV_MAX])
            except (BlockingIOError, InterruptedError):
                await self._writable()
                continue
            except OSError as exc:
                self._lost(f"send failed: {exc}")
                raise ConnectionError(self._lost_reason) from exc
            while sent:
                head = buffers[index]
                if sent >= len(head):
                    sent -= len(head)
                    index += 1
                else:
                    buffers[index] = head[sent:]
                    sent = 0

    async def _writable(self) -> None:
        if self._lost_reason is not None:
            raise ConnectionError(self._lost_reason)
        fd = self._sock.fileno()
        ready = self._loop.create_future()
        self._loop.add_writer(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            self._loop.remove_writer(fd)

    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(f"connection broken: {exc}")
            return
        self._lost("receiver closed the connection" if not data else "receiver sent unexpected bytes")

    def _lost(self, reason: str) -> None:
        if self._lost_reason is not None:
            return
        self._lost_reason = reason
        self.close()
        self._on_lost(self.peer_id, reason)

    def close(self) -> None:
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            self._loop.remove_writer(self._sock.fileno())
            self._sock.close()
        if self._lost_reason is None:
            self._lost_reason = "link closed"
