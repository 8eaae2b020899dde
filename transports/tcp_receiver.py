"""The receiving end of one tcp link: frames land straight in the destination blocks."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from minipd.transports.connection_slots import ConnectionSlots
from minipd.transports.link_auth import SENDER_LABEL, receiver_proof
from minipd.transports.receive_ledger import ReceiveLedger, Verdict
from minipd.transports.shared_secret import NONCE_BYTES, SharedSecret, new_nonce
from minipd.transports.wire import (
    MAX_HANDSHAKE_HEADER_BYTES,
    Abort,
    Challenge,
    Finish,
    Hello,
    HelloAck,
    LayerHeader,
    Message,
    Refused,
    decode_message,
    message_encoder,
)

if TYPE_CHECKING:
    from minipd.transports.pool_layout import PoolLayout

logger = logging.getLogger(__name__)

PREFIX = struct.Struct("!I")  # header length, then the msgpack header, then the payload
# Late bytes of an aborted request are read into a scratch buffer of this size and thrown away.
DISCARD_BYTES = 1 << 20
# A sender that has not completed the handshake by then is disconnected.
HANDSHAKE_TIMEOUT_S = 10.0
# A refused sender's link is half-closed and what it still sends is discarded for this long,
# so that the refusal reaches it (closing with its bytes unread would reset the connection
# and could destroy the refusal in flight).
REFUSAL_LINGER_S = 1.0


class ReceiverSetup(NamedTuple):
    """What every link of one tcp listener shares."""

    ledger: ReceiveLedger
    layout: PoolLayout
    pool_view: memoryview
    max_payload_bytes: int
    max_header_bytes: int  # once authenticated; before, MAX_HANDSHAKE_HEADER_BYTES
    secret: SharedSecret | None
    slots: ConnectionSlots
    discard: memoryview  # scratch for dropped bytes, shared: the loop fills one buffer at a time
    on_closed: Callable[["FrameReceiver"], None]
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S


def encode_frame(message: Message) -> bytes:
    header = message_encoder.encode(message)
    return PREFIX.pack(len(header)) + header


class FrameReceiver(asyncio.BufferedProtocol):
    """Parses `[u32 header length][msgpack header][payload]` frames from one sender.

    `get_buffer` hands the event loop a memoryview of the pool itself for payload bytes, so
    the kernel copies them straight from the socket into the destination blocks. The link
    opens with the handshake (`link_auth.py`): we send a Challenge, the first frame back must
    be a Hello naming the sender and, with a secret, proving it; we answer HelloAck or Refused.
    The peer id is then fixed for the link's life. Every header is judged by the ledger before
    any payload byte is read; a violation (unknown request, run outside the reservation, bad
    size, malformed header) closes the link and leaves the pool untouched. A link holds at
    most one header's bytes (MAX_HANDSHAKE_HEADER_BYTES until authenticated); payload goes
    to the pool or the shared scratch buffer, never to a buffer of its own.
    """

    def __init__(self, setup: ReceiverSetup) -> None:
        self._setup = setup
        self._ledger = setup.ledger
        self._layout = setup.layout
        self._pool_view = setup.pool_view
        self._max_payload_bytes = setup.max_payload_bytes
        self._transport: asyncio.Transport | None = None
        self.peer_id: str | None = None
        self._challenge = new_nonce()
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._prefix = bytearray(PREFIX.size)
        self._header = bytearray(MAX_HANDSHAKE_HEADER_BYTES)
        self._discard = setup.discard
        self._expect_prefix()
        # the payload being received: its request, ledger token, and (pool offset, length) targets
        self._request_id = ""
        self._token = None
        self._targets: list[tuple[int, int]] = []
        self._dropping = False

    # ---- asyncio protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        admitted, evicted = self._setup.slots.admit(self)
        if not admitted:
            self._state = "closed"
            transport.abort()
            return
        if evicted is not None:
            evicted.close()
        self._transport.write(encode_frame(Challenge(self._challenge)))
        self._handshake_timer = asyncio.get_running_loop().call_later(
            self._setup.handshake_timeout_s, self._handshake_expired
        )

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == "payload":
            if not self._dropping and not self._ledger.is_accepting(self._request_id, self._token):
                self._dropping = True  # aborted midway: the rest goes to the scratch buffer
            offset, length = self._targets[self._target_index]
            left = length - self._filled
            if self._dropping:
                return self._discard[: min(left, DISCARD_BYTES)]
            start = offset + self._filled
            return self._pool_view[start : start + left]
        return self._small_view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._state == "closed":
            self._filled = 0
        elif self._state == "payload":
            self._payload_progress()
        elif self._filled == len(self._small_view):
            if self._state == "prefix":
                self._on_prefix()
            else:
                self._on_header()

    def connection_lost(self, exc: Exception | None) -> None:
        self._setup.slots.release(self)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self._setup.on_closed(self)
        self._end_payload(cut=True)
        if self.peer_id is not None:
            reason = f"connection lost: {exc}" if exc else "connection closed by the sender"
            self._ledger.fail_peer(self.peer_id, reason)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # ---- frame parsing -----------------------------------------------------------------

    def _expect_prefix(self) -> None:
        self._state = "prefix"
        self._small_view = memoryview(self._prefix)
        self._filled = 0

    def _on_prefix(self) -> None:
        (length,) = PREFIX.unpack(self._prefix)
        if not 0 < length <= len(self._header):
            self._violation(
                f"header length {length} outside (0, {len(self._header)}]"
                + ("" if self.peer_id is not None else " before the handshake")
            )
            return
        self._state = "header"
        self._small_view = memoryview(self._header)[:length]
        self._filled = 0

    def _on_header(self) -> None:
        try:
            message = decode_message(self._small_view, len(self._header))
        except ValueError as exc:
            self._violation(str(exc))
            return
        if self.peer_id is None:
            if not isinstance(message, Hello):
                self._violation(f"first frame must be hello, got {type(message).__name__}")
                return
            self._authenticate(message)
            return
        match message:
            case LayerHeader():
                self._on_layer(message)
            case Finish(request_id=request_id, num_bytes=num_bytes):
                self._ledger.record_end(self.peer_id, request_id, num_bytes)
                self._expect_prefix()
            case Abort(request_id=request_id):
                self._ledger.record_end(self.peer_id, request_id, None)
                self._expect_prefix()
            case _:
                self._violation(f"unexpected {type(message).__name__} on an open link")

    def _authenticate(self, hello: Hello) -> None:
        """Accept the sender (fixing its peer id for this link) or refuse it, saying why."""
        if (hello.num_layers, hello.block_bytes) != (self._layout.num_layers, self._layout.block_bytes):
            self._refuse(hello.peer_id, "sender's pool layout does not match ours")
            return
        secret = self._setup.secret
        if secret is not None:
            if not hello.proof:
                self._refuse(hello.peer_id, "the sender has no cluster secret; this instance requires one")
                return
            if len(hello.nonce) != NONCE_BYTES or not secret.verify(
                hello.proof,
                SENDER_LABEL,
                self._challenge,
                hello.nonce,
                hello.peer_id,
                hello.num_layers,
                hello.block_bytes,
            ):
                self._refuse(hello.peer_id, "the sender's proof of the cluster secret is wrong (the secrets differ)")
                return
        self.peer_id = hello.peer_id
        self._handshake_timer.cancel()
        self._setup.slots.establish(self)
        self._transport.write(
            encode_frame(HelloAck(receiver_proof(secret, self._challenge, hello.nonce, hello.peer_id)))
        )
        self._header = bytearray(self._setup.max_header_bytes)
        self._expect_prefix()

    def _refuse(self, claimed_peer: str, reason: str) -> None:
        """Tell the sender why the handshake failed, then hang up (see REFUSAL_LINGER_S)."""
        logger.warning("refusing tcp KV link from %r: %s", claimed_peer, reason)
        self._state = "closed"
        self._small_view = self._discard
        self._filled = 0
        self._handshake_timer.cancel()
        self._transport.write(encode_frame(Refused(reason)))
        self._transport.write_eof()
        asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, self._transport.abort)

    def _handshake_expired(self) -> None:
        if self.peer_id is None and self._state != "closed":
            self._violation(f"no handshake within {self._setup.handshake_timeout_s} s")

    def _on_layer(self, header: LayerHeader) -> None:
        if header.num_bytes > self._max_payload_bytes:
            self._violation(f"payload of {header.num_bytes} bytes exceeds the {self._max_payload_bytes}-byte cap")
            return
        verdict, reason = self._ledger.check_write(
            self.peer_id, header.request_id, header.layer, header.runs, header.num_bytes
        )
        if verdict is Verdict.REJECT:
            self._violation(reason)
            return
        block_bytes = self._layout.block_bytes
        self._targets = [(self._layout.offset(header.layer, dst), count * block_bytes) for dst, count in header.runs]
        self._request_id = header.request_id
        self._dropping = verdict is Verdict.DROP
        if self._dropping:
            logger.debug("dropping %d late bytes of %r", header.num_bytes, header.request_id)
        else:
            self._token = self._ledger.begin_landing(header.request_id)
        self._payload_bytes = header.num_bytes
        self._state = "payload"
        self._target_index = 0
        self._filled = 0
        if not self._targets:
            self._end_payload(cut=False)

    def _payload_progress(self) -> None:
        if self._filled < self._targets[self._target_index][1]:
            return
        self._target_index += 1
        self._filled = 0
        if self._target_index == len(self._targets):
            self._end_payload(cut=False)

    def _end_payload(self, cut: bool) -> None:
        if self._token is not None:
            landed = 0 if cut or self._dropping else self._payload_bytes
            self._ledger.end_landing(self._token, self._request_id, landed)
            self._token = None
        if not cut:
            self._expect_prefix()

    def _violation(self, reason: str) -> None:
        logger.warning("closing tcp link from %r: %s", self.peer_id or "unknown sender", reason)
        self._state = "closed"
        self._small_view = self._discard
        self._filled = 0
        if self._transport is not None:
            self._transport.abort()
