"""The transport interface: move one layer's KV blocks from this instance's pool straight into
blocks that a peer instance reserved in its pool.

Lifecycle and call pattern (all calls on the event-loop thread of the owning instance):

1. `Transport(pool, instance_id=..., link_gbps=...)` then `await start()`, once per
   instance: registers the whole pool (the transport may read and write any block of it
   for the rest of its life; the caller keeps owning the tensor and must not free it
   before `close()`).
2. `describe()` -> opaque bytes; the control plane carries them to peers.
   `await connect(description)` on the sender, once per peer, returns the peer's id.
3. Receiver (decode), once per request before prefill starts:
   `expect(request_id, peer_id, dst_block_ids)`. From then until the request's outcome
   is reported, the transport owns those destination blocks: only `peer_id` may write
   them, only inside that reservation; anything else is rejected before a byte lands.
   With a cluster secret (`secret=`), `peer_id` is an authenticated identity: a link or
   header that does not prove the secret is refused (`link_auth.py` says what each
   backend can enforce).
4. Sender (prefill), once per layer per request, possibly interleaved across requests:
   `write_layer(peer_id, request_id, layer, runs)` returns an awaitable at once; the
   source blocks must stay unchanged until it resolves. Then, once per request,
   `await finish_request(peer_id, request_id)`, which waits for the request's writes and
   tells the receiver the total.
5. Receiver learns the outcome exactly once, either by `await wait_landed(request_id)` or
   from `poll_landed()` (whichever asks first). After it, the blocks are the caller's
   again: adopt them on success, free them on failure.
6. `await abort(request_id, on_fenced)` on either side drops a request midway: afterwards
   nothing about it is reported. On the receiver, no byte of it lands in the blocks once
   `on_fenced()` is called, exactly once: at once where the backend refuses late bytes itself
   (tcp, loopback) or its posted receives are cancelled (ucx), and for one-sided writes (nixl)
   only once the sender ended the request or is known unable to write; until then the
   blocks stay held (`num_fencing`), never reused, never lost. A request that failed is
   aborted the same way to get its blocks back (a one-sided sender may still be writing).
   `peer_lost(peer_id, reason, fenced)` is how the control plane reports a peer gone:
   pending requests with it fail; `fenced` says its process can write no more (dead, not
   merely unresponsive), which releases every request held for it.
7. `await close()` once.

Failures: every failure of a transfer raises (or reports) `TransferError` naming the peer
and the request. Programming errors (a block outside the pool, an unknown layer) raise
ValueError synchronously. No wait on a peer is unbounded: a send or a wait for the receiver
that makes no progress for `stall_timeout_s` fails with TransferError.

The contract is read and enforced here; the calls one request makes (expect, wait_landed,
write_layer, finish_request, and the write path) are request_calls.py's, which `Transport`
inherits; the receiver's bookkeeping is in receive_ledger.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch

from minipd.transports.block_run import BlockRun
from minipd.transports.fences import Fences, call
from minipd.transports.link_limiter import LinkLimiter
from minipd.transports.pool_layout import PoolLayout
from minipd.transports.receive_ledger import MAX_REMEMBERED_ABORTS, Expected, ReceiveLedger, RecentIds
from minipd.transports.request_calls import RequestCalls, _Sending
from minipd.transports.shared_secret import SharedSecret
from minipd.transports.transfer_error import TransferError
from minipd.transports.wire import PoolDescription, decode_description, message_encoder

logger = logging.getLogger(__name__)

# A send, or a sender's wait for its receiver, that makes no progress for this long fails.
DEFAULT_STALL_TIMEOUT_S = 30.0


class Transport(RequestCalls, ABC):
    """Moves KV blocks between pools of instances; see the module docstring for the contract.

    Subclasses implement the `_`-prefixed hooks; the public calls, validation, the link
    limit and the receiver's bookkeeping live here and in `RequestCalls` (request_calls.py:
    the calls one request's transfer makes) so that every backend behaves alike.
    """

    backend: ClassVar[str]
    # True when writes are one-sided (the receiver cannot refuse them): abort on the
    # receiver then waits for the sender's end-of-request message.
    one_sided: ClassVar[bool] = False

    def __init__(
        self,
        pool: torch.Tensor,
        *,
        instance_id: str,
        link_gbps: float | None = None,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        secret: SharedSecret | None = None,
    ) -> None:
        if stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s: must be positive, got {stall_timeout_s}")
        self.pool = pool
        # The cluster secret: links and headers are authenticated with it (see link_auth.py).
        self.secret = secret
        self.layout = PoolLayout.from_tensor(pool)
        self.instance_id = instance_id
        self.stall_timeout_s = stall_timeout_s
        self._limiter: LinkLimiter | None = None
        self.set_link_gbps(link_gbps)
        self._ledger = ReceiveLedger(self.layout)
        self._peers: dict[str, PoolDescription] = {}
        self._sending: dict[str, _Sending] = {}
        self._sender_aborted: RecentIds[None] = RecentIds(MAX_REMEMBERED_ABORTS)
        self._fenced_peers: set[str] = set()  # reported unable to write, and not heard of since
        self._fences = Fences()
        self._closed = False

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def link_gbps(self) -> float | None:
        """The egress cap in Gbit/s, None when uncapped."""
        return self._limiter.gbps if self._limiter is not None else None

    def set_link_gbps(self, gbps: float | None) -> None:
        """Cap egress at `gbps` Gbit/s (None or 0: uncapped) from the next write issued on;
        writes already waiting for the link keep the pace they were booked at. ValueError for
        a negative or non-finite rate."""
        if gbps is not None and gbps != 0 and not (gbps > 0 and math.isfinite(gbps)):
            raise ValueError(f"link_gbps: must be a positive number of Gbit/s, got {gbps}")
        self._limiter = LinkLimiter(gbps) if gbps else None

    async def start(self) -> None:
        """Register the pool and start receiving. Called once, on the event loop."""
        await self._start()

    def describe(self) -> bytes:
        """This instance's pool and address as opaque msgpack bytes for the control plane."""
        return message_encoder.encode(
            PoolDescription(
                backend=self.backend,
                instance_id=self.instance_id,
                num_layers=self.layout.num_layers,
                num_blocks=self.layout.num_blocks,
                block_bytes=self.layout.block_bytes,
                endpoint=self._endpoint(),
                base_address=self.layout.base_address,
                device_index=self.layout.device_index,
                mem_type=self._mem_type(),
            )
        )

    async def connect(self, description: bytes) -> str:
        """Connect to the peer that `description` describes (once per peer, sender side);
        returns its peer id. Raises TransferError if the pools are incompatible or the peer
        cannot be reached."""
        try:
            peer = decode_description(description)
        except ValueError as exc:
            raise TransferError("", "", str(exc)) from None
        if peer.backend != self.backend:
            raise TransferError(peer.instance_id, "", f"peer uses transport {peer.backend!r}, we use {self.backend!r}")
        if (peer.num_layers, peer.block_bytes) != (self.layout.num_layers, self.layout.block_bytes):
            raise TransferError(
                peer.instance_id,
                "",
                (
                    f"incompatible KV pools: peer has {peer.num_layers} layers of {peer.block_bytes}-byte blocks, "
                    f"we have {self.layout.num_layers} of {self.layout.block_bytes}"
                ),
            )
        if peer.instance_id not in self._peers:
            try:
                await self._connect(peer)
            except TransferError:
                raise
            except Exception as exc:  # backend-specific connect failures
                raise TransferError(peer.instance_id, "", f"cannot connect: {exc}") from exc
            self._peers[peer.instance_id] = peer
            self._fenced_peers.discard(peer.instance_id)
        return peer.instance_id

    async def close(self) -> None:
        """Stop everything and release the pool registration. Pending requests fail."""
        if self._closed:
            return
        self._closed = True
        for peer_id in list(self._peers):
            self._fail_peer(peer_id, "transport closed")
        self._fences.release_all()  # the pool goes away with us: nothing can land in it for anyone
        await self._close()

    # ---- receiver (the per-request calls are request_calls.py's) -----------------------

    @property
    def num_fencing(self) -> int:
        """Aborted requests whose blocks are held until their fence (see `abort`)."""
        return len(self._fences)

    # ---- both sides ------------------------------------------------------------------

    async def abort(
        self, request_id: str, on_fenced: Callable[[], None] | None = None, peer_id: str | None = None
    ) -> bool:
        """Drop `request_id` midway, on whichever side(s) this instance plays for it. Sender:
        cancels writes not yet issued, waits for issued ones (each bounded by the stall
        timeout), tells the receiver; given the `peer_id` it was to be sent to, tells that
        receiver even if no write was issued yet (a one-sided receiver waits for that word
        before it reuses the blocks). Receiver: rejects further data for it at once, and calls
        `on_fenced()` exactly once when no byte of it can land any more (see the module
        docstring): the caller frees its blocks then, not before. Nothing about the request is
        reported afterwards. Returns whether the request was pending; aborting twice is
        harmless (`on_fenced` of an unknown request is called at once)."""
        was_pending = False
        sending = self._sending.pop(request_id, None)
        if sending is not None:
            was_pending = True
            # Writes already issued run to completion (a move cut midway would corrupt the
            # link); writes not yet issued see the flag and never start.
            sending.aborted = True
            self._sender_aborted.remember(request_id, None)
            await asyncio.gather(*sending.writes, return_exceptions=True)
            await self._send_end_quietly(sending.peer_id, request_id, None)
        elif peer_id is not None:  # nothing issued, or its end already sent: say it (again), harmlessly
            self._sender_aborted.remember(request_id, None)
            await self._send_end_quietly(peer_id, request_id, None)
        if request_id in self._fences:  # aborted before and still held: released together
            self._fences.join(request_id, on_fenced)
            return was_pending
        pending, entry = self._ledger.abort(request_id)
        was_pending = was_pending or pending
        if entry is None or entry.peer_id in self._fenced_peers or self._fence_now(entry.peer_id, request_id, entry):
            self._ledger.fenced(request_id)
            call(on_fenced, request_id)
        else:
            logger.info("holding the blocks of aborted %r until %r can write no more", request_id, entry.peer_id)
            self._fences.hold(
                request_id,
                entry.peer_id,
                self._fenced_callback(request_id, on_fenced),
                self._fence(entry.peer_id, request_id, entry),
            )
        return was_pending

    def _fenced_callback(self, request_id: str, on_fenced: Callable[[], None] | None) -> Callable[[], None]:
        def fenced() -> None:
            self._ledger.fenced(request_id)
            call(on_fenced, request_id)

        return fenced

    def peer_lost(self, peer_id: str, reason: str, fenced: bool = True) -> None:
        """The control plane says `peer_id` is gone: fail everything pending with it (each
        request reported once) and drop the link. `fenced`: its process can write no more (it
        died, or ended every request first), so the blocks held for it are released too;
        False for a peer that merely stopped answering (it may yet resume and write). Safe to
        call more than once."""
        self._fail_peer(peer_id, reason)
        if fenced:
            self._fenced_peers.add(peer_id)
            self._fences.release_peer(peer_id)

    # ---- for backends ----------------------------------------------------------------

    def _fail_peer(self, peer_id: str, reason: str) -> None:
        self._ledger.fail_peer(peer_id, reason)
        self._peers.pop(peer_id, None)
        for sending in self._sending.values():
            if sending.peer_id == peer_id:
                for task in sending.writes:
                    # Safe to cancel mid-move: the link to this peer is being torn down.
                    task.cancel(f"peer {peer_id!r} lost: {reason}")
        self._drop_peer(peer_id, reason)

    async def _send_end_quietly(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        if peer_id not in self._peers:
            return
        try:
            await self._send_end(peer_id, request_id, num_bytes)
        except Exception as exc:  # the peer may be gone; the abort itself already succeeded
            logger.info("could not tell %r that %r ended: %s", peer_id, request_id, exc)

    def _fence_now(self, peer_id: str, request_id: str, entry: Expected) -> bool:
        """Receiver hook, called once the ledger refuses further bytes of aborted (or failed)
        `request_id`: True if none can land any more. Default: no receive into its blocks is in
        flight (a two-sided backend refuses later bytes itself). A backend may cancel its
        posted receives here."""
        return entry.in_flight == 0

    async def _fence(self, peer_id: str, request_id: str, entry: Expected) -> None:
        """Receiver hook: return once no byte of `request_id` can land (called when
        `_fence_now` said not yet). Default: once no receive is in flight."""
        await entry.quiet.wait()

    @abstractmethod
    async def _start(self) -> None:
        """Register the pool and start receiving."""

    @abstractmethod
    def _endpoint(self) -> bytes:
        """How peers reach us (the `endpoint` field of our description)."""

    def _mem_type(self) -> str:
        return "VRAM" if self.layout.device_type == "cuda" else "DRAM"

    @abstractmethod
    async def _connect(self, peer: PoolDescription) -> None:
        """Open the link to `peer`; raise on failure."""

    @abstractmethod
    async def _write(self, peer_id: str, request_id: str, layer: int, runs: list[BlockRun]) -> None:
        """Move the runs; return when the source bytes may be reused."""

    @abstractmethod
    async def _send_end(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        """Tell the receiver the request is complete with `num_bytes` in total, or aborted (None)."""

    @abstractmethod
    def _drop_peer(self, peer_id: str, reason: str) -> None:
        """Tear down the link to a lost peer, without blocking."""

    @abstractmethod
    async def _close(self) -> None:
        """Release the pool registration and every link."""
