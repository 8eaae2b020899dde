"""In-process transport: copies between two pools of one process (Python API, tests)."""

from __future__ import annotations

import logging

import numpy as np

from minipd.transports import fault_points
from minipd.transports.base import Transport
from minipd.transports.block_run import BlockRun
from minipd.transports.loopback_hub import LoopbackHub
from minipd.transports.pool_layout import pool_bytes
from minipd.transports.receive_ledger import Verdict
from minipd.transports.transfer_error import TransferError
from minipd.transports.wire import PoolDescription

logger = logging.getLogger(__name__)


class LoopbackTransport(Transport):
    """Copies runs straight from our pool into the peer's pool: a memcpy between host pools,
    torch `copy_` for anything involving a device. Peers find each other through a shared `LoopbackHub`; every
    transport that should talk must be created with the same hub. The receiver's checks
    (reservation, abort) run before each copy, exactly as for a remote peer, so an aborted
    request is fenced at once."""

    backend = "loopback"

    def __init__(self, pool, *, instance_id: str, hub: LoopbackHub[LoopbackTransport] | None = None, **options) -> None:
        super().__init__(pool, instance_id=instance_id, **options)
        self._hub = hub if hub is not None else LoopbackHub()
        self._host_bytes = pool_bytes(pool).numpy() if self.layout.device_type == "cpu" else None

    async def _start(self) -> None:
        self._hub.add(self.instance_id, self)

    def _endpoint(self) -> bytes:
        return self._hub.token

    async def _connect(self, peer: PoolDescription) -> None:
        if peer.endpoint != self._hub.token:
            raise TransferError(peer.instance_id, "", "loopback peers must share one LoopbackHub")
        self._hub.get(peer.instance_id)

    async def _write(self, peer_id: str, request_id: str, layer: int, runs: list[BlockRun]) -> None:
        if layer > 0:
            await fault_points.reached("kv.mid_payload", request_id)
        peer = self._hub.get(peer_id)
        wire_runs = [(run.dst_start, run.num_blocks) for run in runs]
        num_bytes = sum(run.num_blocks for run in runs) * self.layout.block_bytes
        verdict, reason = peer.accept_write(self.instance_id, request_id, layer, wire_runs, num_bytes)
        if verdict is Verdict.REJECT:
            raise TransferError(peer_id, request_id, f"receiver rejected the write: {reason}")
        if verdict is Verdict.DROP:
            return
        block_bytes = self.layout.block_bytes
        for run in runs:
            if self._host_bytes is not None and peer._host_bytes is not None:
                # one plain memcpy: torch's copy_ splits big copies across its thread pool,
                # which stalls badly when the compute thread holds the other cores
                src_at, dst_at = self.layout.offset(layer, run.src_start), peer.layout.offset(layer, run.dst_start)
                length = run.num_blocks * block_bytes
                np.copyto(peer._host_bytes[dst_at : dst_at + length], self._host_bytes[src_at : src_at + length])
            else:
                src = self.pool[layer, run.src_start : run.src_start + run.num_blocks]
                peer.pool[layer, run.dst_start : run.dst_start + run.num_blocks].copy_(src)
        peer.landed(self.instance_id, request_id, num_bytes)

    async def _send_end(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        self._hub.get(peer_id).ended(self.instance_id, request_id, num_bytes)

    # Called by a peer's _write/_send_end (same thread, same loop).

    def accept_write(self, peer_id: str, request_id: str, layer: int, runs, num_bytes: int) -> tuple[Verdict, str]:
        verdict, reason = self._ledger.check_write(peer_id, request_id, layer, runs, num_bytes)
        if verdict is Verdict.REJECT:
            logger.warning("rejected loopback write from %r: %s", peer_id, reason)
        return verdict, reason

    def _fence_now(self, peer_id: str, request_id: str, entry) -> bool:
        return True  # each write is judged and copied in one go on this loop: none is half done

    def landed(self, peer_id: str, request_id: str, num_bytes: int) -> None:
        self._ledger.record_landed(peer_id, request_id, num_bytes)

    def ended(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        self._ledger.record_end(peer_id, request_id, num_bytes)

    def _drop_peer(self, peer_id: str, reason: str) -> None:
        pass  # nothing to tear down in-process

    async def _close(self) -> None:
        self._hub.remove(self.instance_id)
