"""Receiver-side bookkeeping shared by every backend: what is expected, what has landed, and
reporting each request's outcome exactly once."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

from minipd.transports import fault_points
from minipd.transports.pool_layout import PoolLayout
from minipd.transports.results import ReceiveOutcome, RequestLanded
from minipd.transports.transfer_error import TransferError

logger = logging.getLogger(__name__)

# Aborted request ids remembered so their late data is dropped quietly instead of being
# treated as an unknown request (which closes the link); the oldest are forgotten first.
MAX_REMEMBERED_ABORTS = 4096
V = TypeVar("V")


class RecentIds(Generic[V]):
    """A bounded memory of recently seen request ids (aborted ones, mostly): at most `capacity`
    ids, each with a value; remembering one more forgets the oldest. Bounded so that a
    long-running instance does not grow with every request it ever saw."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._ids: OrderedDict[str, V] = OrderedDict()

    def remember(self, request_id: str, value: V) -> None:
        self._ids[request_id] = value
        self._ids.move_to_end(request_id)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def get(self, request_id: str) -> V | None:
        return self._ids.get(request_id)

    def forget(self, request_id: str) -> None:
        self._ids.pop(request_id, None)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class Verdict(enum.Enum):
    """What to do with an announced write."""

    ACCEPT = "accept"  # land it in the destination blocks
    DROP = "drop"  # the request was aborted or failed here: consume and discard the bytes
    REJECT = "reject"  # protocol violation: close the link, touch nothing


class Expected:
    """One expected request."""

    def __init__(self, peer_id: str, dst_block_ids: Sequence[int]) -> None:
        self.peer_id = peer_id
        self.dst_blocks = frozenset(int(b) for b in dst_block_ids)
        self.bytes_landed = 0
        self.last_landed_at = 0.0  # time.time() when the latest bytes landed
        self.bytes_promised: int | None = None
        self.in_flight = 0
        self.quiet = asyncio.Event()  # set while no receive into its blocks is in flight
        self.quiet.set()
        self.ended = asyncio.Event()  # set once the sender said it will write no more
        self.waiter: asyncio.Future[RequestLanded] | None = None


class ReceiveLedger:
    """Tracks requests a receiver expects; used from the event-loop thread only.

    Backends call `check_write` before landing anything, `begin_landing`/`end_landing` around
    receives that write pool memory, and `record_end` when the sender says the request is
    complete or aborted. The transport's public receiver calls (`expect`, `wait_landed`,
    `poll_landed`, `abort`, `peer_lost`) map one to one onto this class.

    A request that failed keeps its entry (bounded) until `abort` collects it: its blocks may
    still be written by a one-sided sender, so the transport fences it like an aborted one.
    """

    def __init__(self, layout: PoolLayout) -> None:
        self._layout = layout
        self._expected: dict[str, Expected] = {}
        self._outcomes: dict[str, ReceiveOutcome] = {}
        self._aborted: RecentIds[str] = RecentIds(MAX_REMEMBERED_ABORTS)  # request id -> its peer
        self._failed: RecentIds[Expected] = RecentIds(MAX_REMEMBERED_ABORTS)  # failed, not yet aborted
        self._fencing: dict[str, Expected] = {}  # aborted, blocks not yet fenced (see fences.py)

    def expect(self, request_id: str, peer_id: str, dst_block_ids: Sequence[int]) -> None:
        if request_id in self._expected or request_id in self._outcomes:
            raise ValueError(f"request {request_id!r} is already expected")
        for block in dst_block_ids:
            self._layout.check_blocks(int(block), 1, "destination")
        self._aborted.forget(request_id)
        self._failed.forget(request_id)
        self._expected[request_id] = Expected(peer_id, dst_block_ids)

    def check_write(
        self, peer_id: str, request_id: str, layer: int, runs: Sequence[tuple[int, int]], num_bytes: int
    ) -> tuple[Verdict, str]:
        """Judge an announced write of `runs` ((dst_start, num_blocks) pairs) before any byte
        of it touches the pool; returns the verdict and, unless ACCEPT, why."""
        entry = self._expected.get(request_id)
        if entry is None:
            if self._aborted.get(request_id) == peer_id or request_id in self._outcomes:
                return Verdict.DROP, f"request {request_id!r} was aborted or has failed"
            return Verdict.REJECT, f"unknown request id {request_id!r}"
        if entry.peer_id != peer_id:
            return Verdict.REJECT, f"request {request_id!r} is expected from {entry.peer_id!r}, not {peer_id!r}"
        if not 0 <= layer < self._layout.num_layers:
            return Verdict.REJECT, f"layer {layer} outside the pool's {self._layout.num_layers} layers"
        total_blocks = 0
        for dst_start, count in runs:
            if count < 1 or any(b not in entry.dst_blocks for b in range(dst_start, dst_start + count)):
                return Verdict.REJECT, f"run ({dst_start}, {count}) outside the reservation of {request_id!r}"
            total_blocks += count
        if total_blocks * self._layout.block_bytes != num_bytes:
            return Verdict.REJECT, f"byte count {num_bytes} does not match {total_blocks} blocks"
        return Verdict.ACCEPT, ""

    def is_accepting(self, request_id: str, token: Expected | None = None) -> bool:
        """Whether bytes of `request_id` may still land in its blocks (checked again mid-payload,
        because an abort can come between the header and the last byte). With the `token` of
        `begin_landing`, only for that very reservation (not a later one of the same id)."""
        entry = self._expected.get(request_id)
        return entry is not None and (token is None or entry is token)

    def begin_landing(self, request_id: str) -> Expected:
        """A receive into the blocks of accepted `request_id` is starting; returns the token to
        pass to `end_landing` (valid even if the request is aborted or failed meanwhile)."""
        entry = self._expected[request_id]
        entry.in_flight += 1
        entry.quiet.clear()
        return entry

    def end_landing(self, token: Expected, request_id: str, num_bytes: int) -> None:
        """The receive begun with `token` ended; `num_bytes` of it landed (0 if it was cut)."""
        token.in_flight -= 1
        token.bytes_landed += num_bytes
        if num_bytes:
            token.last_landed_at = time.time()
        if token.in_flight == 0:
            token.quiet.set()
        if self._expected.get(request_id) is token:
            self._note_partly_landed(request_id, token, num_bytes)
            self._maybe_complete(request_id, token)

    def record_landed(self, peer_id: str, request_id: str, num_bytes: int) -> None:
        """`num_bytes` landed without a begin/end pair (one-sided writes, in-process copies)."""
        entry = self._expected.get(request_id)
        if entry is not None and entry.peer_id == peer_id:
            entry.bytes_landed += num_bytes
            if num_bytes:
                entry.last_landed_at = time.time()
            self._note_partly_landed(request_id, entry, num_bytes)
            self._maybe_complete(request_id, entry)

    @staticmethod
    def _note_partly_landed(request_id: str, entry: Expected, num_bytes: int) -> None:
        # The first landing, while more is to come. UCX can tell the total (Finish) before any
        # byte lands, so "not all of them" is judged against the promise when there is one.
        first = num_bytes and entry.bytes_landed == num_bytes
        if first and (entry.bytes_promised is None or num_bytes < entry.bytes_promised):
            fault_points.hit("kv.partly_landed", request_id)

    def record_end(self, peer_id: str, request_id: str, num_bytes: int | None) -> None:
        """The sender ended the request: complete with `num_bytes` in all, or aborted (None)."""
        for entries in (self._expected, self._fencing):
            entry = entries.get(request_id)
            if entry is not None and entry.peer_id == peer_id:
                entry.ended.set()
        failed = self._failed.get(request_id)
        if failed is not None and failed.peer_id == peer_id:
            failed.ended.set()
        if num_bytes is None:
            self._record_sender_abort(peer_id, request_id)
        else:
            self._record_finish(peer_id, request_id, num_bytes)

    def _record_finish(self, peer_id: str, request_id: str, num_bytes: int) -> None:
        entry = self._expected.get(request_id)
        if entry is None:
            self._forget_abort(request_id, peer_id)
            return
        if entry.peer_id != peer_id:
            logger.warning("finish for %r from %r ignored: expected from %r", request_id, peer_id, entry.peer_id)
            return
        entry.bytes_promised = num_bytes
        self._maybe_complete(request_id, entry)

    def _record_sender_abort(self, peer_id: str, request_id: str) -> None:
        entry = self._expected.get(request_id)
        if entry is None:
            self._forget_abort(request_id, peer_id)
        elif entry.peer_id == peer_id:
            self._fail(request_id, TransferError(peer_id, request_id, "the sender aborted the request"))

    def fail_peer(self, peer_id: str, reason: str) -> None:
        """Fail every request expected from `peer_id` (link lost or peer declared dead)."""
        for request_id in [r for r, e in self._expected.items() if e.peer_id == peer_id]:
            self._fail(request_id, TransferError(peer_id, request_id, reason))

    def fail_request(self, request_id: str, reason: str) -> None:
        entry = self._expected.get(request_id)
        if entry is not None:
            self._fail(request_id, TransferError(entry.peer_id, request_id, reason))

    def peer_of(self, request_id: str) -> str | None:
        entry = self._expected.get(request_id)
        return entry.peer_id if entry else None

    def has_pending(self) -> bool:
        return bool(self._expected)

    def has_pending_from(self, peer_id: str) -> bool:
        return any(e.peer_id == peer_id for e in self._expected.values())

    def abort(self, request_id: str) -> tuple[bool, Expected | None]:
        """Stop accepting data for `request_id`; returns whether it was pending, and the entry
        to fence (None if nothing of it can land: unknown, or landed whole). A failed request's
        entry is returned too (not pending). Until `fenced(request_id)`, the sender's end is
        still recorded on the entry (`ended`)."""
        self._outcomes.pop(request_id, None)
        entry = self._expected.pop(request_id, None)
        pending = entry is not None
        if entry is None:
            entry = self._failed.get(request_id)
            self._failed.forget(request_id)
            if entry is None:
                return False, None
        else:
            self._remember_abort(request_id, entry.peer_id)
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_exception(TransferError(entry.peer_id, request_id, "aborted by the receiver"))
        self._fencing[request_id] = entry
        return pending, entry

    def fenced(self, request_id: str) -> None:
        """The blocks of aborted `request_id` went back to their owner: forget its entry."""
        self._fencing.pop(request_id, None)

    async def wait(self, request_id: str, timeout: float | None) -> RequestLanded:
        outcome = self._outcomes.pop(request_id, None)
        if outcome is not None:
            return _unwrap(outcome)
        entry = self._expected.get(request_id)
        if entry is None:
            raise TransferError("", request_id, "request is not expected (never, or already reported)")
        if entry.waiter is not None:
            raise ValueError(f"request {request_id!r} already has a waiter")
        entry.waiter = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(asyncio.shield(entry.waiter), timeout)
        except TimeoutError:
            entry.waiter = None
            raise TransferError(entry.peer_id, request_id, f"not landed within {timeout} s") from None

    def poll(self) -> list[ReceiveOutcome]:
        outcomes = list(self._outcomes.values())
        self._outcomes.clear()
        return outcomes

    def _maybe_complete(self, request_id: str, entry: Expected) -> None:
        if entry.bytes_promised is None or entry.in_flight or entry.bytes_landed < entry.bytes_promised:
            return
        if entry.bytes_landed > entry.bytes_promised:
            self._fail(
                request_id,
                TransferError(
                    entry.peer_id, request_id, f"{entry.bytes_landed} bytes landed but {entry.bytes_promised} were sent"
                ),
            )
            return
        del self._expected[request_id]
        self._deliver(
            request_id,
            entry,
            ReceiveOutcome(
                request_id,
                RequestLanded(request_id, entry.peer_id, entry.bytes_landed, entry.last_landed_at or time.time()),
                None,
            ),
        )

    def _fail(self, request_id: str, error: TransferError) -> None:
        entry = self._expected.pop(request_id)
        self._remember_abort(request_id, entry.peer_id)
        self._failed.remember(request_id, entry)
        logger.info("%s", error)
        self._deliver(request_id, entry, ReceiveOutcome(request_id, None, error))

    def _deliver(self, request_id: str, entry: Expected, outcome: ReceiveOutcome) -> None:
        # Exactly once: to the waiter if one is waiting, otherwise to the next poll.
        if entry.waiter is not None and not entry.waiter.done():
            if outcome.error is not None:
                entry.waiter.set_exception(outcome.error)
            else:
                entry.waiter.set_result(outcome.landed)
        else:
            self._outcomes[request_id] = outcome

    def _remember_abort(self, request_id: str, peer_id: str) -> None:
        self._aborted.remember(request_id, peer_id)

    def _forget_abort(self, request_id: str, peer_id: str) -> None:
        if self._aborted.get(request_id) == peer_id:
            self._aborted.forget(request_id)


def _unwrap(outcome: ReceiveOutcome) -> RequestLanded:
    if outcome.error is not None:
        raise outcome.error
    assert outcome.landed is not None
    return outcome.landed
