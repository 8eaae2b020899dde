"""NIXL transport: one-sided WRITEs of block runs from our registered pool into the peer's,
with a notification per layer write; the receiver polls notifications from the event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import msgspec
import numpy as np

from minipd.transports import fault_points
from minipd.transports.base import Transport
from minipd.transports.block_run import BlockRun
from minipd.transports.link_auth import HeaderSeal
from minipd.transports.receive_ledger import Expected, Verdict
from minipd.transports.transfer_error import TransferError
from minipd.transports.wakeable_sleep import WakeableSleep
from minipd.transports.wire import Abort, Finish, LayerHeader, Message, PoolDescription, decode_message

# NIXL's Python logger prints INFO to stdout unless told otherwise; it reads this on import.
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")


def _rdma_devices() -> list[str]:
    """The RDMA devices the kernel knows (names under /sys/class/infiniband), none if absent."""
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def skip_rdma_modules_without_devices() -> bool:
    """Keep the UCX that NIXL bundles from loading its InfiniBand modules on a host with no
    RDMA device; True when it did so. Why: those modules pull in the bundled libnl-route,
    whose destructors crash at process exit (SIGSEGV in `rtnl_tc_unregister`, after Python has
    finalized), so every process that made a NIXL agent ended with rc 139 even after a clean
    shutdown. Without a device the modules have nothing to drive; with one, or when the user
    set `UCX_MODULES` themselves, nothing is changed. Must run before the first agent loads
    UCX (UCX reads its configuration once, when its library loads)."""
    if "UCX_MODULES" in os.environ or _rdma_devices():
        return False
    os.environ["UCX_MODULES"] = "^ib"
    return True


skip_rdma_modules_without_devices()
from nixl_cu12._api import nixl_agent, nixl_agent_config  # noqa: E402

logger = logging.getLogger(__name__)

BACKEND = "UCX"
LOCAL_AGENT = "NIXL_INIT_AGENT"
# Polling (progress thread off): yield to the loop for up to SPIN_S, then back off from MIN
# to MAX seconds between polls; idle receivers poll every IDLE seconds.
SPIN_S = 2e-3
SPIN_BYTES_PER_S = 2e9
MIN_POLL_S = 50e-6
MAX_POLL_S = 250e-6
IDLE_POLL_S = 5e-3

_encoder = msgspec.msgpack.Encoder()


def _block_rows(base_address: int, num_layers: int, num_blocks: int, block_bytes: int, device: int) -> np.ndarray:
    """(addr, len, dev) rows for every block of every layer, row index layer*num_blocks+block."""
    rows = np.empty((num_layers * num_blocks, 3), dtype=np.uint64)
    rows[:, 0] = base_address + np.arange(num_layers * num_blocks, dtype=np.uint64) * block_bytes
    rows[:, 1] = block_bytes
    rows[:, 2] = device
    return rows


class _Backoff:
    """Poll pacing: spin briefly (a move usually finishes within it), then sleep longer and
    longer, so a stalled peer does not burn a core that the other process here needs."""

    def __init__(self, num_bytes: int = 0) -> None:
        # spin for as long as the move would take at a rate we still call healthy
        self._spin_until = time.monotonic() + SPIN_S + num_bytes / SPIN_BYTES_PER_S
        self._sleep_s = MIN_POLL_S

    async def pause(self) -> None:
        if time.monotonic() < self._spin_until:
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(self._sleep_s)
            self._sleep_s = min(MAX_POLL_S, self._sleep_s * 2)


class NixlTransport(Transport):
    """The pool is registered with a NIXL agent (UCX backend, progress thread off) and
    descriptor lists of every block are prepared once, locally and per peer; a write is one
    prepared WRITE of the runs' blocks (NIXL merges adjacent descriptors) carrying the layer
    header as its notification. Writes are one-sided: the receiver checks each layer
    header against its reservation when the notification arrives, after the bytes landed,
    so a misbehaving sender is detected (the request fails, the peer is dropped), not
    prevented. With a secret, every notification carries a proof of it (one without is
    ignored), so no forged notification makes a request count as landed; the WRITE itself
    cannot be refused (`link_auth.py`). The blocks of a request aborted on the receiver are
    fenced only once the sender has ended the request (its end follows its last write) or its
    process is known gone (`peer_lost(..., fenced=True)`): only then can no more bytes arrive.
    A sender whose WRITE makes no progress for the stall timeout fails it. Liveness comes from
    the control plane through `peer_lost`."""

    backend = "nixl"
    one_sided = True

    def __init__(self, pool, *, instance_id: str, **options) -> None:
        super().__init__(pool, instance_id=instance_id, **options)
        self._agent = None
        self._registration = None
        self._local = None
        self._remote: dict[str, tuple[str, object, int]] = {}  # peer -> (agent, dlist, num_blocks)
        self._poll_task: asyncio.Task | None = None
        self._unsettled: set[str] = set()  # requests with a WRITE that timed out still posted
        self._idle = WakeableSleep()  # between polls while nothing is expected
        self._seal = HeaderSeal(self.secret)

    async def _start(self) -> None:
        config = nixl_agent_config(enable_prog_thread=False, backends=[BACKEND])
        self._agent = nixl_agent(self.instance_id, config)
        self._registration = self._agent.register_memory(self.pool)
        layout = self.layout
        rows = _block_rows(
            layout.base_address, layout.num_layers, layout.num_blocks, layout.block_bytes, layout.device_index
        )
        self._local = self._agent.prep_xfer_dlist(LOCAL_AGENT, rows, self._mem_type())
        self._poll_task = asyncio.get_running_loop().create_task(self._poll_notifications())

    def _endpoint(self) -> bytes:
        return self._agent.get_agent_metadata()

    async def _connect(self, peer: PoolDescription) -> None:
        agent_name = self._agent.add_remote_agent(peer.endpoint)
        rows = _block_rows(peer.base_address, peer.num_layers, peer.num_blocks, peer.block_bytes, peer.device_index)
        dlist = self._agent.prep_xfer_dlist(agent_name, rows, peer.mem_type)
        self._agent.make_connection(agent_name)
        self._remote[peer.instance_id] = (agent_name, dlist, peer.num_blocks)

    # ---- sender ------------------------------------------------------------------------

    async def _write(self, peer_id: str, request_id: str, layer: int, runs: list[BlockRun]) -> None:
        if layer > 0:
            await fault_points.reached("kv.mid_payload", request_id)
        agent_name, remote, peer_blocks = self._remote_of(peer_id, request_id)
        local_ids = np.concatenate([np.arange(r.src_start, r.src_start + r.num_blocks) for r in runs])
        remote_ids = np.concatenate([np.arange(r.dst_start, r.dst_start + r.num_blocks) for r in runs])
        local_ids += layer * self.layout.num_blocks
        remote_ids += layer * peer_blocks
        num_bytes = len(local_ids) * self.layout.block_bytes
        notice = self._seal.seal(
            _encoder.encode(LayerHeader(request_id, layer, [(r.dst_start, r.num_blocks) for r in runs], num_bytes)),
            self.instance_id,
        )
        try:
            handle = self._agent.make_prepped_xfer(
                "WRITE", self._local, local_ids.astype(np.int32), remote, remote_ids.astype(np.int32), notice
            )
        except Exception as exc:  # nixl binding errors share no base class worth naming
            raise TransferError(peer_id, request_id, f"NIXL cannot prepare the WRITE: {exc!r}") from exc
        state = "ERR"
        try:
            state = self._agent.transfer(handle)
            backoff = _Backoff(num_bytes)
            deadline = time.monotonic() + self.stall_timeout_s
            while state == "PROC":
                await backoff.pause()
                state = self._agent.check_xfer_state(handle)
                # Looked at once more after the deadline (this process may have been the one
                # frozen): still posted, it may land whenever it moves again, so this request's
                # end must not tell the receiver its blocks are safe.
                if state == "PROC" and time.monotonic() > deadline:
                    self._unsettled.add(request_id)
                    raise TimeoutError(f"still in progress after {self.stall_timeout_s} s")
        except Exception as exc:
            raise TransferError(peer_id, request_id, f"NIXL WRITE of layer {layer} failed: {exc!r}") from exc
        finally:
            if state != "PROC":
                handle.release()
        if state != "DONE":
            raise TransferError(peer_id, request_id, f"NIXL WRITE of layer {layer} ended in state {state}")

    async def _send_end(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        agent_name, _, _ = self._remote_of(peer_id, request_id)
        if request_id in self._unsettled:
            self._unsettled.discard(request_id)
            logger.warning(
                "not ending %r towards %r: a WRITE of it is still posted; the receiver keeps its "
                "blocks until this instance is known gone",
                request_id,
                peer_id,
            )
            return
        message = Abort(request_id) if num_bytes is None else Finish(request_id, num_bytes)
        try:
            self._agent.send_notif(agent_name, self._seal.seal(_encoder.encode(message), self.instance_id))
        except Exception as exc:
            raise TransferError(peer_id, request_id, f"NIXL notification failed: {exc!r}") from exc

    def _remote_of(self, peer_id: str, request_id: str) -> tuple[str, object, int]:
        remote = self._remote.get(peer_id)
        if remote is None:
            raise TransferError(peer_id, request_id, "no NIXL connection to this peer")
        return remote

    # ---- receiver ----------------------------------------------------------------------

    async def _poll_notifications(self) -> None:
        backoff = _Backoff()
        while True:
            notifications = self._agent.get_new_notifs()
            for peer_id, messages in notifications.items():
                for raw in messages:
                    body = self._seal.open(raw, peer_id)
                    if body is None:
                        logger.warning(
                            "dropping a NIXL notification from %r that does not prove the cluster secret", peer_id
                        )
                        continue
                    try:
                        message = decode_message(body)
                    except ValueError as exc:
                        logger.warning("dropping malformed NIXL notification from %r: %s", peer_id, exc)
                        continue
                    self._on_message(peer_id, message)
            if notifications:
                backoff = _Backoff()
            if self._ledger.has_pending():  # held fences wait at the idle pace: no transfer waits on them
                await backoff.pause()
            else:
                await self._idle(IDLE_POLL_S)
                backoff = _Backoff()

    def _on_expect(self) -> None:
        self._idle.wake()

    def _on_message(self, peer_id: str, message: Message) -> None:
        match message:
            case LayerHeader(request_id=request_id, layer=layer, runs=runs, num_bytes=num_bytes):
                verdict, reason = self._ledger.check_write(peer_id, request_id, layer, runs, num_bytes)
                if verdict is Verdict.ACCEPT:
                    self._ledger.record_landed(peer_id, request_id, num_bytes)
                elif verdict is Verdict.REJECT:
                    logger.error("peer %r wrote outside what we allow (%s); dropping it", peer_id, reason)
                    self._ledger.fail_peer(peer_id, f"protocol violation: {reason}")
            case Finish(request_id=request_id, num_bytes=num_bytes):
                self._ledger.record_end(peer_id, request_id, num_bytes)
            case Abort(request_id=request_id):
                self._ledger.record_end(peer_id, request_id, None)
            case _:
                logger.warning("ignoring unexpected %s from %r", type(message).__name__, peer_id)

    def _fence_now(self, peer_id: str, request_id: str, entry: Expected) -> bool:
        # One-sided: only the sender's end (sent after its last write completed) says that no
        # more bytes will arrive.
        return entry.ended.is_set()

    async def _fence(self, peer_id: str, request_id: str, entry: Expected) -> None:
        await entry.ended.wait()

    # ---- teardown ----------------------------------------------------------------------

    def _drop_peer(self, peer_id: str, reason: str) -> None:
        remote = self._remote.pop(peer_id, None)
        if remote is not None:
            agent_name, dlist, _ = remote
            try:
                dlist.release()
                self._agent.remove_remote_agent(agent_name)
            except Exception as exc:  # a dead peer can make NIXL's teardown complain
                logger.info("NIXL teardown of %r: %r", peer_id, exc)

    async def _close(self) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
        if self._agent is None:
            return
        for peer_id in list(self._remote):
            self._drop_peer(peer_id, "closed")
        self._local.release()
        self._agent.deregister_memory(self._registration)
