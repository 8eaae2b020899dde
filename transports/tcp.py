"""TCP transport: asyncio (uvloop) streams, msgspec headers, payload received into the pool."""

from __future__ import annotations

import asyncio
import logging

from minipd.transports.base import Transport
from minipd.transports.block_run import BlockRun, split_runs
from minipd.transports.connection_slots import DEFAULT_MAX_CONNECTIONS, ConnectionSlots
from minipd.transports.pool_layout import pool_bytes
from minipd.transports.receive_ledger import Expected
from minipd.transports.tcp_link import TcpLink
from minipd.transports.tcp_receiver import DISCARD_BYTES, FrameReceiver, ReceiverSetup
from minipd.transports.transfer_error import TransferError
from minipd.transports.wire import Abort, Finish, LayerHeader, PoolDescription, max_layer_header_bytes

logger = logging.getLogger(__name__)

# Payload per frame: big enough that the per-frame header and syscalls vanish (>= ~1 MiB),
# small enough that frames of interleaved requests take turns.
FRAME_TARGET_BYTES = 16 << 20
# What a receiver accepts in one frame (at least one block, whatever the block size).
MAX_FRAME_PAYLOAD_BYTES = 256 << 20
DEFAULT_HOST = "127.0.0.1"


class TcpTransport(Transport):
    """Listens on `host:port` (port 0 picks a free one) for senders; connects to receivers.

    Options: `host`, `port`, `max_connections` (incoming links at once; links that have not
    authenticated give way to new ones, see `ConnectionSlots`). With a `secret`, every link
    opens with a mutual HMAC challenge and the sender's peer id is bound to it
    (`link_auth.py`). The pool must be in CPU memory: payload is received with
    `recv_into` straight into the blocks, which device memory cannot take (construction
    raises ValueError for a CUDA pool; use ucx or nixl there). A sender's link failing
    fails its pending writes with TransferError; a receiver's incoming link failing fails
    the requests expected from that sender. A send that makes no progress for the stall
    timeout drops the link. An aborted request is fenced at once: the receiver checks, each
    time the loop hands it bytes, that the request is still accepted, and sends the rest of a
    cut payload to a scratch buffer.
    """

    backend = "tcp"

    def __init__(
        self,
        pool,
        *,
        instance_id: str,
        host: str = DEFAULT_HOST,
        port: int = 0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        **options,
    ) -> None:
        super().__init__(pool, instance_id=instance_id, **options)
        self._slots: ConnectionSlots[FrameReceiver] = ConnectionSlots(max_connections, f"tcp KV port of {instance_id}")
        if self.layout.device_type != "cpu":
            raise ValueError(
                f"tcp transport needs a CPU pool (it receives with recv_into), got "
                f"{self.layout.device_type!r} memory; use the ucx or nixl transport"
            )
        self._host = host
        self._port = port
        self._bytes = memoryview(pool_bytes(pool).numpy())
        self._server: asyncio.AbstractServer | None = None
        self._links: dict[str, TcpLink] = {}
        self._receivers: set[FrameReceiver] = set()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        setup = ReceiverSetup(
            ledger=self._ledger,
            layout=self.layout,
            pool_view=self._bytes,
            max_payload_bytes=max(MAX_FRAME_PAYLOAD_BYTES, self.layout.block_bytes),
            max_header_bytes=max_layer_header_bytes(self.layout.num_blocks),
            secret=self.secret,
            slots=self._slots,
            discard=memoryview(bytearray(DISCARD_BYTES)),
            on_closed=self._receivers.discard,
        )
        self._server = await loop.create_server(lambda: self._track(FrameReceiver(setup)), self._host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]
        logger.info("tcp transport %r listening on %s:%d", self.instance_id, self._host, self._port)

    def _track(self, receiver: FrameReceiver) -> FrameReceiver:
        self._receivers.add(receiver)
        return receiver

    def _endpoint(self) -> bytes:
        return f"{self._host}:{self._port}".encode()

    async def _connect(self, peer: PoolDescription) -> None:
        host, _, port = peer.endpoint.decode().rpartition(":")
        self._links[peer.instance_id] = await TcpLink.open(
            host,
            int(port),
            self.instance_id,
            self.layout,
            self.secret,
            peer.instance_id,
            self._fail_peer,
            self.stall_timeout_s,
        )

    async def _write(self, peer_id: str, request_id: str, layer: int, runs: list[BlockRun]) -> None:
        link = self._link(peer_id, request_id)
        block_bytes = self.layout.block_bytes
        max_blocks = max(1, FRAME_TARGET_BYTES // block_bytes)
        for batch in split_runs(runs, max_blocks):
            payload = []
            for run in batch:
                start = self.layout.offset(layer, run.src_start)
                payload.append(self._bytes[start : start + run.num_blocks * block_bytes])
            num_bytes = sum(run.num_blocks for run in batch) * block_bytes
            header = LayerHeader(request_id, layer, [(run.dst_start, run.num_blocks) for run in batch], num_bytes)
            await link.send(header, payload, request_id)

    async def _send_end(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        message = Abort(request_id) if num_bytes is None else Finish(request_id, num_bytes)
        await self._link(peer_id, request_id).send(message, ())

    def _fence_now(self, peer_id: str, request_id: str, entry: Expected) -> bool:
        # Bytes land only inside the loop's read callback, after `get_buffer` checked that the
        # request is still accepted: once the ledger refuses it, nothing more can land.
        return True

    def _link(self, peer_id: str, request_id: str) -> TcpLink:
        link = self._links.get(peer_id)
        if link is None:
            raise TransferError(peer_id, request_id, "no tcp link to this peer")
        return link

    def _drop_peer(self, peer_id: str, reason: str) -> None:
        link = self._links.pop(peer_id, None)
        if link is not None:
            link.close()

    async def _close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()
        for receiver in list(self._receivers):
            receiver.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
