"""The sending end of one tcp link: scatter-gather writes straight from the source blocks."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Sequence

from minipd.transports import fault_points
from minipd.transports.link_auth import RECEIVER_LABEL, sender_proof
from minipd.transports.pool_layout import PoolLayout
from minipd.transports.shared_secret import NONCE_BYTES, SharedSecret, new_nonce
from minipd.transports.tcp_receiver import HANDSHAKE_TIMEOUT_S, PREFIX, encode_frame
from minipd.transports.wire import (
    MAX_HANDSHAKE_HEADER_BYTES,
    Challenge,
    Hello,
    HelloAck,
    Message,
    Refused,
    decode_message,
    message_encoder,
)

logger = logging.getLogger(__name__)

# sendmsg takes at most IOV_MAX buffers per call.
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
# A larger send buffer keeps the kernel busy while the loop wakes up.
SEND_BUFFER_BYTES = 4 << 20


class TcpLink:
    """One outgoing connection to a receiver. Frames are sent whole and in call order (a
    lock serialises them); payload buffers are memoryviews of the pool, handed to `sendmsg`
    together with the header, so nothing is copied in user space. `on_lost` is called once
    when the receiver closes the connection, it breaks, or a send makes no progress for
    `stall_timeout_s` (the receiver stopped reading)."""

    def __init__(
        self, sock: socket.socket, peer_id: str, on_lost: Callable[[str, str], None], stall_timeout_s: float
    ) -> None:
        self._sock = sock
        self.peer_id = peer_id
        self._on_lost = on_lost
        self._stall_timeout_s = stall_timeout_s
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._lost_reason: str | None = None
        # After the handshake the receiver never sends; readability means it closed the link or it broke.
        self._loop.add_reader(sock.fileno(), self._on_readable)

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        sender_id: str,
        layout: PoolLayout,
        secret: SharedSecret | None,
        peer_id: str,
        on_lost: Callable[[str, str], None],
        stall_timeout_s: float,
        timeout: float = HANDSHAKE_TIMEOUT_S,
    ) -> TcpLink:
        """Connect and handshake (`link_auth.py`) as `sender_id`; raises ConnectionError saying
        why the receiver refused us or failed to prove the secret, TimeoutError, or OSError."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        try:
            await asyncio.wait_for(
                _connect_and_handshake(loop, sock, (host, port), sender_id, layout, secret, peer_id), timeout
            )
        except asyncio.TimeoutError:
            sock.close()
            raise TimeoutError(f"no KV link handshake with {peer_id} at {host}:{port} within {timeout} s") from None
        except BaseException:
            sock.close()
            raise
        return cls(sock, peer_id, on_lost, stall_timeout_s)

    async def send(self, message: Message, payload: Sequence[memoryview], request_id: str = "") -> None:
        """Send one frame: `message` as the header, then the payload buffers in order. Raises
        ConnectionError if the link is or goes down."""
        header = message_encoder.encode(message)
        buffers = [memoryview(PREFIX.pack(len(header)) + header), *payload]
        async with self._lock:
            if self._lost_reason is not None:
                raise ConnectionError(self._lost_reason)
            if payload and fault_points.armed():
                first, rest = _split(buffers, sum(len(b) for b in buffers) // 2)
                await self._send_all(first)
                await fault_points.reached("kv.mid_payload", request_id)
                buffers = rest
            await self._send_all(buffers)

    async def _send_all(self, buffers: list[memoryview]) -> None:
        index = 0
        while index < len(buffers):
            try:
                sent = self._sock.sendmsg(buffers[index : index + IOV_MAX])
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
            await asyncio.wait_for(ready, self._stall_timeout_s)
        except TimeoutError:
            self._lost(f"no progress sending for {self._stall_timeout_s} s (the receiver stopped reading)")
            raise ConnectionError(self._lost_reason) from None
        finally:
            if self._sock.fileno() >= 0:
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


async def _connect_and_handshake(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    address: tuple[str, int],
    sender_id: str,
    layout: PoolLayout,
    secret: SharedSecret | None,
    peer_id: str,
) -> None:
    await loop.sock_connect(sock, address)
    challenge = await _read_message(loop, sock, peer_id)
    if not isinstance(challenge, Challenge):
        raise ConnectionError(f"{peer_id} opened the KV link with {type(challenge).__name__}, not a challenge")
    nonce = new_nonce()
    hello = Hello(
        sender_id,
        layout.num_layers,
        layout.block_bytes,
        nonce,
        sender_proof(secret, challenge.nonce, nonce, sender_id, layout.num_layers, layout.block_bytes),
    )
    await loop.sock_sendall(sock, encode_frame(hello))
    answer = await _read_message(loop, sock, peer_id)
    match answer:
        case Refused(reason=reason):
            raise ConnectionError(f"{peer_id} refused the KV link: {reason}")
        case HelloAck(proof=proof):
            if secret is None:
                return
            if not proof:
                raise ConnectionError(f"{peer_id} has no cluster secret configured; refusing to send it KV")
            if len(challenge.nonce) != NONCE_BYTES or not secret.verify(
                proof, RECEIVER_LABEL, challenge.nonce, nonce, sender_id
            ):
                raise ConnectionError(f"{peer_id} did not prove the cluster secret; refusing to send it KV")
        case _:
            raise ConnectionError(f"{peer_id} answered the KV handshake with {type(answer).__name__}")


async def _read_message(loop: asyncio.AbstractEventLoop, sock: socket.socket, peer_id: str) -> Message:
    (length,) = PREFIX.unpack(await _read_exactly(loop, sock, PREFIX.size, peer_id))
    if not 0 < length <= MAX_HANDSHAKE_HEADER_BYTES:
        raise ConnectionError(f"{peer_id} sent a handshake frame of {length} bytes")
    try:
        return decode_message(await _read_exactly(loop, sock, length, peer_id), MAX_HANDSHAKE_HEADER_BYTES)
    except ValueError as exc:
        raise ConnectionError(f"{peer_id} sent a malformed handshake frame: {exc}") from None


async def _read_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int, peer_id: str) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await loop.sock_recv(sock, size - len(data))
        if not chunk:
            raise ConnectionError(f"{peer_id} closed the KV link during the handshake")
        data += chunk
    return bytes(data)


def _split(buffers: list[memoryview], at: int) -> tuple[list[memoryview], list[memoryview]]:
    """The buffers cut into the first `at` bytes and the rest."""
    first: list[memoryview] = []
    for index, buffer in enumerate(buffers):
        if at < len(buffer):
            return first + [buffer[:at]], [buffer[at:], *buffers[index + 1 :]]
        first.append(buffer)
        at -= len(buffer)
    return first, []
