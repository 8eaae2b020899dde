"""UCX transport (ucxx): tagged sends from the source blocks into receives posted on the
destination blocks, over an endpoint made from the receiver's worker address (shared memory
on one host, RDMA where the hardware has it). Worker progress is in ucx_progress.py, the early
end of a request in ends_after_headers.py.

Longer than 400 lines because: one backend, sender and receiver sides of one protocol (header, READY, payload), which
only make sense read together.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import secrets
import struct
from typing import Callable, NamedTuple

import msgspec

from minipd.transports import fault_points
from minipd.transports.block_run import BlockRun
from minipd.transports.ends_after_headers import EndsAfterHeaders
from minipd.transports.link_auth import HeaderSeal
from minipd.transports.pool_layout import pool_bytes
from minipd.transports.receive_ledger import Expected, Verdict
from minipd.transports.transfer_error import TransferError
from minipd.transports.ucx_progress import MAX_POLL_S, ProgressDriver, detach_ucxx_progress, ucx_worker
from minipd.transports.wire import MAX_HEADER_BYTES, Abort, Finish, LayerHeader, Message, PoolDescription

# isort: off
import ucxx  # noqa: E402  (after ucx_progress has set UCX's environment)
from ucxx._lib.arr import Array  # noqa: E402
from ucxx._lib.libucxx import UCXEndpoint  # noqa: E402
from ucxx.types import Tag, TagMaskFull  # noqa: E402
# isort: on

logger = logging.getLogger(__name__)

# Every header goes to this tag; payload tags are (sender nonce << 32) | sequence number, and a
# nonce is never 0, so they cannot collide with it (or with another sender's).
HEADER_TAG = 0
NONCE_SHIFT = 32
SEQUENCE_MASK = (1 << NONCE_SHIFT) - 1
PREFIX = struct.Struct("!I")
PROGRESS_MODE = "blocking"  # event-driven on the asyncio loop; no extra progress thread
# Payload above ucxx's rendezvous threshold (8 KiB) goes by rendezvous: on one host the
# receiver reads it straight from the sender's blocks into its own (CMA), one copy where
# eager takes two (into a shared-memory FIFO and out). Between huge-page pools (see
# `allocate_host_tensor`) this measured a median of 0.80 of memcpy against 0.72 for eager.
# The sender still posts the payload only after the receiver's READY reply (sent once its
# receives are posted, or to refuse the layer): a send nobody will ever receive would never
# complete under rendezvous.
# One status byte per layer, sent by the receiver to tag `tag_base + len(runs)` of the sender.
READY_GO, READY_SKIP, READY_REFUSED = 1, 2, 3
CLOSE_PERIOD_NS = 1_000_000_000
# With no transfer expected, the header receive polls this rarely: an idle instance (every
# prefill instance, a decode instance between requests) must not take CPU from its engine.
IDLE_POLL_S = 20e-3


class Envelope(msgspec.Struct, array_like=True, frozen=True):
    """A header plus its sender: worker-level receives do not say which endpoint sent them."""

    peer_id: str
    message: Message
    reply_to: bytes = b""  # the sender's worker address, where a LayerHeader's READY goes


_envelope_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(Envelope)


class _Landing(NamedTuple):
    """Receives posted into the blocks of one layer of one request."""

    peer_id: str
    request_id: str
    requests: list


def _load_request_cancel() -> Callable[[object], None] | None:
    """ucxx's Python binding does not expose `ucxx::Request::cancel()`; the C++ method of the
    libucxx it loaded is called directly (None if that library or symbol is not found: then
    an aborted request's posted receives are left to complete or to their peer's loss)."""
    try:
        import libucxx

        path = os.path.join(os.path.dirname(libucxx.__file__), "lib64", "libucxx.so")
        method = ctypes.CDLL(path)._ZN4ucxx7Request6cancelEv
    except (ImportError, OSError, AttributeError) as exc:
        logger.warning("cannot cancel posted ucx receives (%s); aborted requests wait for their sender", exc)
        return None
    method.argtypes = [ctypes.c_void_p]
    method.restype = None
    return lambda request: method(request.ucxx_ptr)


_cancel_request = _load_request_cancel()


class UcxTransport(EndsAfterHeaders):
    """Receiver: one header receive is always posted on the worker; a layer header is judged
    by the ledger, then one tagged receive per run is posted straight into the destination
    blocks, then a READY byte goes back to the sender's worker (address in the header's
    envelope). With a secret, every header carries a proof of it and one without is dropped
    before any receive is posted (`link_auth.py` says what that does and does not stop).
    Sender: posts the header, awaits READY, then one tagged send per run from the source
    blocks and awaits them all, each wait bounded by the stall timeout. Endpoint error
    handling is off (it would force TCP), so UCX reports no dead peers: liveness comes from
    the control plane through `peer_lost`. An aborted request is fenced by cancelling its
    posted receives (a receive already matched completes by itself: under rendezvous the
    receiver moves the bytes); so are a lost sender's, since a sender that only stopped
    answering may resume and send. Its endpoint is parked rather than closed. ucxx has one
    worker per process, so an instance runs at most one UcxTransport (two would steal each
    other's headers).
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
        self._landing: dict[asyncio.Task, _Landing] = {}
        self._address = b""
        self._reply_endpoints: dict[str, tuple[bytes, UCXEndpoint]] = {}
        self._progress = ProgressDriver()
        self._seal = HeaderSeal(self.secret)
        self._replies: list[tuple[Array, object]] = []  # READY sends still in flight
        # Buffers UCX may still write into (a READY receive of a write cut short): kept alive.
        self._parked: list[object] = []

    async def _start(self) -> None:
        try:
            ucxx.init(progress_mode=PROGRESS_MODE)
        except RuntimeError:
            logger.debug("ucxx already initialised in this process; sharing its worker")
        detach_ucxx_progress(asyncio.get_running_loop())
        self._address = ucxx.get_worker_address().tobytes()
        self._receive_task = asyncio.get_running_loop().create_task(self._receive_headers())

    def _endpoint(self) -> bytes:
        return ucxx.get_worker_address().tobytes()

    async def _connect(self, peer: PoolDescription) -> None:
        # The bare endpoint, not ucxx's async wrapper: the wrapper's finalizer closes it with a
        # blocking close, which never returns for a dead peer when error handling is off.
        worker = ucx_worker()
        address = ucxx.get_ucx_address_from_buffer(peer.endpoint)
        self._endpoints[peer.instance_id] = UCXEndpoint.create_from_worker_address(
            worker, address, False
        )  # endpoint error handling off: shared memory, not TCP
        worker.progress()

    # ---- sender ------------------------------------------------------------------------

    async def _write(self, peer_id: str, request_id: str, layer: int, runs: list[BlockRun]) -> None:
        endpoint = self._endpoint_of(peer_id, request_id)
        block_bytes = self.layout.block_bytes
        tag_base = self._next_tags(len(runs) + 1)
        num_bytes = sum(run.num_blocks for run in runs) * block_bytes
        header = LayerHeader(request_id, layer, [(r.dst_start, r.num_blocks) for r in runs], num_bytes, tag_base)
        # Posted before the header goes out, so the reply never arrives unexpected.
        ready_byte = bytearray(1)
        ready = Array(ready_byte)
        ready_request = ucx_worker().tag_recv(ready, Tag(tag_base + len(runs)), TagMaskFull)
        try:
            header_buffer, header_request = self._post_header(endpoint, header, reply_to=True)
        except BaseException:
            self._parked.append(ready)
            raise
        regions = [header_buffer, ready]  # UCX holds raw pointers: keep every buffer alive until done
        self._header_out(request_id)
        try:
            await self._bounded_wait([header_request, ready_request], peer_id, request_id, "READY")
        except BaseException:
            self._parked.append(regions)  # e.g. cancelled for a lost peer: the receive stays posted
            raise
        status = ready_byte[0]
        if status == READY_SKIP:
            return  # the receiver dropped the request: it would throw the bytes away
        if status != READY_GO:
            raise TransferError(peer_id, request_id, f"receiver refused layer {layer}")
        await fault_points.reached("kv.mid_payload", request_id)
        requests = []
        for index, run in enumerate(runs):
            start = self.layout.offset(layer, run.src_start)
            regions.append(Array(self._bytes[start : start + run.num_blocks * block_bytes]))
            requests.append(endpoint.tag_send(regions[-1], Tag(tag_base + index)))
        try:
            await self._bounded_wait(requests, peer_id, request_id, "the payload to be received")
        except BaseException:
            self._parked.append(regions)  # the sends stay posted: UCX may still read the blocks' memory
            raise
        del regions

    async def _bounded_wait(self, requests, peer_id: str, request_id: str, what: str) -> None:
        try:
            await asyncio.wait_for(self._progress.wait(requests), self.stall_timeout_s)
        except TimeoutError:
            raise TransferError(
                peer_id, request_id, f"no progress waiting for {what} for {self.stall_timeout_s} s"
            ) from None

    async def _send_end(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        message = Abort(request_id) if num_bytes is None else Finish(request_id, num_bytes)
        buffer, request = self._post_header(self._endpoint_of(peer_id, request_id), message)
        await request.wait()
        del buffer

    def _post_header(self, endpoint, message: Message, reply_to: bool = False):
        """Post a header send; returns (buffer, request): the caller keeps the buffer alive until
        the request completes."""
        body = self._seal.seal(
            _envelope_encoder.encode(Envelope(self.instance_id, message, self._address if reply_to else b""))
        )
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
        worker = ucx_worker()
        view = memoryview(self._header_buffer)
        while True:
            await self._progress.wait(
                [worker.tag_recv(Array(self._header_buffer), Tag(HEADER_TAG), TagMaskFull)], self._header_poll_s
            )
            (length,) = PREFIX.unpack_from(view)
            try:
                if length > MAX_HEADER_BYTES - PREFIX.size:
                    raise msgspec.DecodeError(f"header length {length} over the cap")
                body = self._seal.open(view[PREFIX.size : PREFIX.size + length])
                if body is None:  # checked before anything is posted into the pool
                    logger.warning("dropping a ucx header that does not prove the cluster secret")
                    continue
                envelope = _envelope_decoder.decode(body)
            except msgspec.DecodeError as exc:
                logger.warning("dropping malformed ucx header: %s", exc)
                continue
            self._on_message(envelope.peer_id, envelope.message, envelope.reply_to)

    def _on_expect(self) -> None:
        self._progress.wake()  # the header receive may be in its idle back-off

    def _header_poll_s(self) -> float:
        return MAX_POLL_S if self._ledger.has_pending() else IDLE_POLL_S

    def _on_message(self, peer_id: str, message: Message, reply_to: bytes = b"") -> None:
        match message:
            case LayerHeader():
                self._on_layer(peer_id, message, reply_to)
            case Finish(request_id=request_id, num_bytes=num_bytes):
                self._ledger.record_end(peer_id, request_id, num_bytes)
            case Abort(request_id=request_id):
                self._ledger.record_end(peer_id, request_id, None)
            case _:
                logger.warning("ignoring unexpected %s from %r", type(message).__name__, peer_id)

    def _on_layer(self, peer_id: str, header: LayerHeader, reply_to: bytes) -> None:
        verdict, reason = self._ledger.check_write(
            peer_id, header.request_id, header.layer, header.runs, header.num_bytes
        )
        worker = ucx_worker()
        block_bytes = self.layout.block_bytes
        ready_tag = header.tag_base + len(header.runs)
        if verdict is Verdict.REJECT:
            # No connection of ours to close: the sender is misbehaving, so stop trusting it.
            logger.warning("rejecting ucx writes from %r: %s", peer_id, reason)
            self._ledger.fail_peer(peer_id, f"protocol violation: {reason}")
            self._reply(peer_id, reply_to, ready_tag, READY_REFUSED)
            return
        if verdict is not Verdict.ACCEPT:
            # Late data of an aborted request: the sender skips it, nothing is received.
            self._reply(peer_id, reply_to, ready_tag, READY_SKIP)
            return
        regions, requests = [], []
        for index, (dst_start, count) in enumerate(header.runs):
            start = self.layout.offset(header.layer, dst_start)
            regions.append(Array(self._bytes[start : start + count * block_bytes]))
            requests.append(worker.tag_recv(regions[-1], Tag(header.tag_base + index), TagMaskFull))
        task = asyncio.get_running_loop().create_task(self._land(regions, requests))
        token = self._ledger.begin_landing(header.request_id)
        self._landing[task] = _Landing(peer_id, header.request_id, requests)
        task.add_done_callback(lambda t: self._landed(t, header.request_id, header.num_bytes, token))
        # Only now, with every receive posted, may the payload come.
        if not self._reply(peer_id, reply_to, ready_tag, READY_GO):
            self._ledger.fail_request(header.request_id, "cannot reach the sender to ask for the payload")
            task.cancel()

    def _reply(self, peer_id: str, address: bytes, tag: int, status: int) -> bool:
        """Send a READY status byte to the sender's worker without waiting for it; returns False
        if there is no way to reach the sender."""
        if not address:
            logger.warning("ucx layer header from %r without a reply address", peer_id)
            return False
        known = self._reply_endpoints.get(peer_id)
        if known is None or known[0] != address:
            if known is not None:
                self._lost_endpoints.append(known[1])  # the sender restarted; never close (may block)
            try:
                endpoint = UCXEndpoint.create_from_worker_address(
                    ucx_worker(), ucxx.get_ucx_address_from_buffer(address), False
                )
            except Exception as exc:  # a malformed address from the wire
                logger.warning("cannot reach ucx sender %r: %s", peer_id, exc)
                return False
            known = self._reply_endpoints[peer_id] = (address, endpoint)
        self._replies = [(b, r) for b, r in self._replies if not r.completed]
        buffer = Array(bytearray((status,)))
        self._replies.append((buffer, known[1].tag_send(buffer, Tag(tag))))
        return True

    async def _land(self, regions, requests) -> None:
        # `regions` stays referenced here until every receive into it has completed.
        await self._progress.wait(requests)
        del regions

    def _landed(self, task: asyncio.Task, request_id: str, num_bytes: int, token) -> None:
        self._landing.pop(task, None)
        failed = task.cancelled() or task.exception() is not None
        if failed and not task.cancelled():
            self._ledger.fail_request(request_id, f"receive failed: {task.exception()!r}")
        self._ledger.end_landing(token, request_id, 0 if failed else num_bytes)

    def _cancel_receives(self, which: Callable[[_Landing], bool]) -> None:
        """Cancel the posted receives of the landings `which` picks; their tasks then end with
        UCX's cancellation, once the worker progresses (a matched receive completes instead)."""
        if _cancel_request is None:
            return
        for landing in [landing for landing in self._landing.values() if which(landing)]:
            for request in landing.requests:
                if not request.completed:
                    _cancel_request(request)
        self._progress.wake()

    def _fence_now(self, peer_id: str, request_id: str, entry: Expected) -> bool:
        self._cancel_receives(lambda landing: landing.request_id == request_id)
        return entry.in_flight == 0

    # ---- teardown ----------------------------------------------------------------------

    def _drop_peer(self, peer_id: str, reason: str) -> None:
        endpoint = self._endpoints.pop(peer_id, None)
        if endpoint is not None:
            # Closing would block forever on a dead peer (no error handling); the endpoint is
            # parked instead, its unfinished sends are abandoned with it.
            self._lost_endpoints.append(endpoint)
        self._cancel_receives(lambda landing: landing.peer_id == peer_id)
        reply = self._reply_endpoints.pop(peer_id, None)
        if reply is not None:
            self._lost_endpoints.append(reply[1])

    async def _close(self) -> None:
        for endpoint in self._endpoints.values():
            endpoint.close_blocking(period=CLOSE_PERIOD_NS, max_attempts=1)
        self._endpoints.clear()
        self._reply_endpoints.clear()  # not closed: a dead sender would block the close
        for task in list(self._landing):
            task.cancel()
        if self._receive_task is not None:
            self._receive_task.cancel()
        self._progress.close()
