"""UCX transport (ucxx): tagged sends from the source blocks into receives posted on the
destination blocks, over an endpoint made from the receiver's worker address (shared memory
on one host, RDMA where the hardware has it)."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import struct
import time
from typing import Callable

import msgspec

from minipd.transports.base import Transport
from minipd.transports.block_run import BlockRun
from minipd.transports.errors import TransferError
from minipd.transports.messages import (MAX_HEADER_BYTES, Abort, Finish, LayerHeader, Message,
                                        PoolDescription)
from minipd.transports.pool_layout import pool_bytes
from minipd.transports.receive_ledger import Verdict

os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
import ucxx  # noqa: E402  (after the environment above is set)
from ucxx._lib.arr import Array  # noqa: E402
from ucxx._lib.libucxx import UCXEndpoint  # noqa: E402
from ucxx.types import Tag, TagMaskFull  # noqa: E402

logger = logging.getLogger(__name__)

# Every header goes to this tag; payload tags are (sender nonce << 32) | sequence number, and a
# nonce is never 0, so they cannot collide with it (or with another sender's).
HEADER_TAG = 0
NONCE_SHIFT = 32
SEQUENCE_MASK = (1 << NONCE_SHIFT) - 1
PREFIX = struct.Struct("!I")
PROGRESS_MODE = "blocking"  # event-driven on the asyncio loop; no extra progress thread
# Payload uses UCX's rendezvous protocol (ucxx sets UCX_RNDV_THRESH=8192): data moves only
# once our receive into the pool is matched. Eager sends of any size measured faster here
# (~0.8 vs ~0.6 of memcpy) but only when the receive is posted in time; otherwise UCX buffers
# the whole payload in fresh memory (~0.2 of memcpy, and unbounded receiver memory).
SPIN_S = 2e-3  # a wait spins this long, then sleeps from MIN to MAX seconds between polls
CLOSE_PERIOD_NS = 1_000_000_000
MIN_POLL_S = 50e-6
MAX_POLL_S = 250e-6
# With no transfer expected, the header receive polls this rarely: an idle instance (every
# prefill instance, a decode instance between requests) must not take CPU from its engine.
IDLE_POLL_S = 20e-3


class Envelope(msgspec.Struct, array_like=True, frozen=True):
    """A header plus its sender: worker-level receives do not say which endpoint sent them."""

    peer_id: str
    message: Message


_envelope_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(Envelope)


def _worker():
    # The worker of ucxx's process-wide context: its tag_send/tag_recv requests can be
    # posted in bulk and awaited together, without one asyncio task per message.
    return ucxx.core._get_ctx().worker


async def _progress_until_done(requests, max_poll_s: Callable[[], float] = lambda: MAX_POLL_S) -> None:
    """Wait for UCX requests by driving the worker ourselves: spin (yielding to the loop) while
    requests keep completing at least every SPIN_S, then poll with a sleep that doubles up to MAX_POLL_S. The blocking progress
    mode's epoll wake-ups alone are too coarse here: a wake-up per protocol step costs more
    than the move, and shared-memory arrivals may only be seen at its 1 s fallback timer.
    The backoff keeps a stalled peer from burning a core the other process needs."""
    worker = _worker()
    pending = list(requests)
    spin_until = time.monotonic() + SPIN_S
    sleep_s = MIN_POLL_S
    while pending:
        worker.progress()
        still = [r for r in pending if not r.completed]
        if not still:
            break
        if len(still) < len(pending):  # moving along: keep spinning
            spin_until = time.monotonic() + SPIN_S
            sleep_s = MIN_POLL_S
        pending = still
        if time.monotonic() < spin_until:
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(sleep_s)
            sleep_s = min(max_poll_s(), sleep_s * 2)
    for request in requests:
        request.check_error()


def _detach_ucxx_progress(loop: asyncio.AbstractEventLoop) -> None:
    """Undo the blocking-mode progress that ucxx attaches to the loop when it initialises.

    Its reader on the worker's epoll descriptor fires again and again whenever the worker
    cannot be re-armed (level-triggered), which kept an idle instance's loop at ~100% CPU and
    stretched decode steps several-fold. This transport progresses the worker itself (see
    `_progress_until_done`, including the always-posted header receive), so nothing is lost.
    """
    from ucxx._lib_async import application_context

    progress = application_context.ProgressTasks.pop(loop, None)
    if progress is None:
        return
    loop.remove_reader(_worker().epoll_file_descriptor)
    for task in progress._tasks:
        if task is not None:
            task.cancel()


class UcxTransport(Transport):
    """Receiver: one header receive is always posted on the worker; a layer header is judged
    by the ledger, then one tagged receive per run is posted straight into the destination
    blocks. Sender: posts the header and one tagged send per run from the source blocks and
    awaits them all. Endpoint error handling is off (it would force TCP), so UCX reports no
    dead peers: liveness comes from the control plane through `peer_lost`. A lost sender's
    posted receives can never match again (its nonce is gone), so they count as settled,
    and its endpoint is parked rather than closed. ucxx has one worker per process, so an
    instance runs at most one UcxTransport (two would steal each other's headers).
    """

    backend = "ucx"

    def __init__(self, pool, *, instance_id: str, **options) -> None:
        super().__init__(pool, instance_id=instance_id, **options)
        flat = pool_bytes(pool)
        # Host memory goes to UCX through the buffer protocol, device memory through the
        # CUDA array interface of a torch view.
        self._bytes = flat.numpy() if flat.device.type == "cpu" else flat
        self._header_buffer = bytearray(MAX_HEADER_BYTES)
        self._endpoints: dict[str, UCXEndpoint] = {}
        self._lost_endpoints: list[UCXEndpoint] = []
        self._nonce = secrets.randbelow((1 << NONCE_SHIFT) - 1) + 1
        self._sequence = 0
        self._receive_task: asyncio.Task | None = None
        self._landing: dict[str, set[asyncio.Task]] = {}

    async def _start(self) -> None:
        try:
            ucxx.init(progress_mode=PROGRESS_MODE)
        except RuntimeError:
            logger.debug("ucxx already initialised in this process; sharing its worker")
        _detach_ucxx_progress(asyncio.get_running_loop())
        self._receive_task = asyncio.get_running_loop().create_task(self._receive_headers())

    def _endpoint(self) -> bytes:
        return ucxx.get_worker_address().tobytes()

    async def _connect(self, peer: PoolDescription) -> None:
        # The bare endpoint, not ucxx's async wrapper: the wrapper's finalizer closes it with a
        # blocking close, which never returns for a dead peer when error handling is off.
        worker = _worker()
        address = ucxx.get_ucx_address_from_buffer(peer.endpoint)
        self._endpoints[peer.instance_id] = UCXEndpoint.create_from_worker_address(
            worker, address, False)  # endpoint error handling off: shared memory, not TCP
        worker.progress()

    # ---- sender ------------------------------------------------------------------------

    async def _write(self, peer_id: str, request_id: str, layer: int, runs: list[BlockRun]) -> None:
        endpoint = self._endpoint_of(peer_id, request_id)
        block_bytes = self.layout.block_bytes
        tag_base = self._next_tags(len(runs))
        num_bytes = sum(run.num_blocks for run in runs) * block_bytes
        header = LayerHeader(request_id, layer, [(r.dst_start, r.num_blocks) for r in runs], num_bytes, tag_base)
        header_buffer, header_request = self._post_header(endpoint, header)
        regions = [header_buffer]  # UCX holds raw pointers: keep every buffer alive until done
        requests = [header_request]
        for index, run in enumerate(runs):
            start = self.layout.offset(layer, run.src_start)
            regions.append(Array(self._bytes[start:start + run.num_blocks * block_bytes]))
            requests.append(endpoint.tag_send(regions[-1], Tag(tag_base + index)))
        await _progress_until_done(requests)
        del regions

    async def _send_end(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        message = Abort(request_id) if num_bytes is None else Finish(request_id, num_bytes)
        buffer, request = self._post_header(self._endpoint_of(peer_id, request_id), message)
        await request.wait()
        del buffer

    def _post_header(self, endpoint, message: Message):
        """Post a header send; returns (buffer, request): the caller keeps the buffer alive until
        the request completes."""
        body = _envelope_encoder.encode(Envelope(self.instance_id, message))
        if len(body) + PREFIX.size > MAX_HEADER_BYTES:
            raise ValueError(f"header of {len(body)} bytes exceeds the {MAX_HEADER_BYTES}-byte cap")
        buffer = Array(bytearray(PREFIX.pack(len(body)) + body))
        return buffer, endpoint.tag_send(buffer, Tag(HEADER_TAG))

    def _next_tags(self, count: int) -> int:
        if self._sequence + count > SEQUENCE_MASK:
            self._sequence = 0
        base = (self._nonce << NONCE_SHIFT) | self._sequence
        self._sequence += count
        return base

    def _endpoint_of(self, peer_id: str, request_id: str):
        endpoint = self._endpoints.get(peer_id)
        if endpoint is None:
            raise TransferError(peer_id, request_id, "no ucx endpoint to this peer")
        return endpoint

    # ---- receiver ----------------------------------------------------------------------

    async def _receive_headers(self) -> None:
        worker = _worker()
        view = memoryview(self._header_buffer)
        while True:
            await _progress_until_done([worker.tag_recv(Array(self._header_buffer), Tag(HEADER_TAG), TagMaskFull)],
                                       self._header_poll_s)
            (length,) = PREFIX.unpack_from(view)
            try:
                if length > MAX_HEADER_BYTES - PREFIX.size:
                    raise msgspec.DecodeError(f"header length {length} over the cap")
                envelope = _envelope_decoder.decode(view[PREFIX.size:PREFIX.size + length])
            except msgspec.DecodeError as exc:
                logger.warning("dropping malformed ucx header: %s", exc)
                continue
            self._on_message(envelope.peer_id, envelope.message)

    def _header_poll_s(self) -> float:
        return MAX_POLL_S if self._ledger.has_pending() else IDLE_POLL_S

    def _on_message(self, peer_id: str, message: Message) -> None:
        match message:
            case LayerHeader():
                self._on_layer(peer_id, message)
            case Finish(request_id=request_id, num_bytes=num_bytes):
                self._ledger.record_finish(peer_id, request_id, num_bytes)
            case Abort(request_id=request_id):
                self._ledger.record_sender_abort(peer_id, request_id)
            case _:
                logger.warning("ignoring unexpected %s from %r", type(message).__name__, peer_id)

    def _on_layer(self, peer_id: str, header: LayerHeader) -> None:
        verdict, reason = self._ledger.check_write(peer_id, header.request_id, header.layer, header.runs,
                                                   header.num_bytes)
        worker = _worker()
        block_bytes = self.layout.block_bytes
        if verdict is Verdict.REJECT:
            # No connection of ours to close: the sender is misbehaving, so stop trusting it.
            logger.warning("rejecting ucx writes from %r: %s", peer_id, reason)
            self._ledger.fail_peer(peer_id, f"protocol violation: {reason}")
            return
        regions, requests = [], []
        for index, (dst_start, count) in enumerate(header.runs):
            if verdict is Verdict.ACCEPT:
                start = self.layout.offset(header.layer, dst_start)
                regions.append(Array(self._bytes[start:start + count * block_bytes]))
            else:  # late data of an aborted request: receive it and throw it away
                regions.append(Array(bytearray(count * block_bytes)))
            requests.append(worker.tag_recv(regions[-1], Tag(header.tag_base + index), TagMaskFull))
        task = asyncio.get_running_loop().create_task(self._land(regions, requests))
        if verdict is Verdict.ACCEPT:
            token = self._ledger.begin_landing(header.request_id)
            self._landing.setdefault(peer_id, set()).add(task)
            task.add_done_callback(lambda t: self._landed(t, peer_id, header.request_id, header.num_bytes, token))

    @staticmethod
    async def _land(regions, requests) -> None:
        # `regions` stays referenced here until every receive into it has completed.
        await _progress_until_done(requests)
        del regions

    def _landed(self, task: asyncio.Task, peer_id: str, request_id: str, num_bytes: int, token) -> None:
        self._landing.get(peer_id, set()).discard(task)
        failed = task.cancelled() or task.exception() is not None
        if failed and not task.cancelled():
            self._ledger.fail_request(request_id, f"receive failed: {task.exception()!r}")
        self._ledger.end_landing(token, request_id, 0 if failed else num_bytes)

    # ---- teardown ----------------------------------------------------------------------

    def _drop_peer(self, peer_id: str, reason: str) -> None:
        endpoint = self._endpoints.pop(peer_id, None)
        if endpoint is not None:
            # Closing would block forever on a dead peer (no error handling); the endpoint is
            # parked instead, its unfinished sends are abandoned with it.
            self._lost_endpoints.append(endpoint)
        for task in self._landing.pop(peer_id, set()):
            task.cancel()

    async def _close(self) -> None:
        for endpoint in self._endpoints.values():
            endpoint.close_blocking(period=CLOSE_PERIOD_NS, max_attempts=1)
        self._endpoints.clear()
        for tasks in self._landing.values():
            for task in tasks:
                task.cancel()
        if self._receive_task is not None:
            self._receive_task.cancel()
