"""The per-request calls of a transport, one request's KV transfer: on the receiver `expect`
then `wait_landed` (or `poll_landed`), on the sender `write_layer` per layer then
`finish_request`, and the write path they run (the link limit, the first-write fault point,
turning a backend's failures into TransferError).

`RequestCalls` is the half of `Transport` (base.py) that one request runs; the other half
(lifecycle, aborts and fences, lost peers, the backends' hooks) is base.py's, and so is the
contract both halves keep (its module docstring) and the state they share (`Transport.__init__`:
`layout`, `_ledger`, `_peers`, `_sending`, `_sender_aborted`, `_limiter`). Not used alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from minipd.transports import fault_points
from minipd.transports.block_run import BlockRun
from minipd.transports.results import LayerWritten, ReceiveOutcome, RequestLanded, RequestSent
from minipd.transports.transfer_error import TransferError


class _Sending:
    """Sender-side state of one request."""

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.writes: list[asyncio.Task[LayerWritten]] = []
        self.num_bytes = 0
        self.aborted = False
        self.first_written = False


class RequestCalls:
    """What one request's KV transfer calls on a `Transport` (base.py), which inherits it."""

    # ---- receiver --------------------------------------------------------------------

    def expect(self, request_id: str, peer_id: str, dst_block_ids: Sequence[int]) -> None:
        """Reserve `dst_block_ids` for `request_id`, to be written by `peer_id` only. Call once
        per request before the sender starts. Raises ValueError for a duplicate request id or a
        block outside the pool."""
        self._ledger.expect(request_id, peer_id, dst_block_ids)
        self._fenced_peers.discard(peer_id)
        self._on_expect()

    async def wait_landed(self, request_id: str, timeout: float | None = None) -> RequestLanded:
        """Wait until every layer of `request_id` has landed; raises TransferError if it failed,
        was aborted, or did not land within `timeout` seconds (then it stays expected)."""
        return await self._ledger.wait(request_id, timeout)

    def poll_landed(self) -> list[ReceiveOutcome]:
        """Outcomes of requests that finished since the last call and nobody awaited; each
        request is reported exactly once, by this or by `wait_landed`."""
        return self._ledger.poll()

    # ---- sender ----------------------------------------------------------------------

    def write_layer(
        self, peer_id: str, request_id: str, layer: int, runs: Sequence[BlockRun]
    ) -> asyncio.Task[LayerWritten]:
        """Start writing `runs` of `layer` (local src blocks -> the peer's dst blocks) and
        return a task that resolves once the source blocks may be reused. Call on the event
        loop, once per layer per request; raises ValueError for runs outside either pool,
        TransferError for an unknown peer or an aborted request, and the task raises
        TransferError if the write fails."""
        peer = self._peers.get(peer_id)
        if peer is None:
            raise TransferError(peer_id, request_id, "not connected to this peer")
        self.layout.check_layer(layer)
        for run in runs:
            self.layout.check_blocks(run.src_start, run.num_blocks, "source")
            if run.num_blocks < 1 or run.dst_start < 0 or run.dst_start + run.num_blocks > peer.num_blocks:
                raise ValueError(f"destination run {run} outside the peer's {peer.num_blocks} blocks")
        if request_id in self._sender_aborted:
            raise TransferError(peer_id, request_id, "request was aborted")
        sending = self._sending.setdefault(request_id, _Sending(peer_id))
        if sending.peer_id != peer_id:
            raise ValueError(f"request {request_id!r} is being sent to {sending.peer_id!r}, not {peer_id!r}")
        num_bytes = sum(run.num_blocks for run in runs) * self.layout.block_bytes
        sending.num_bytes += num_bytes
        task = asyncio.get_running_loop().create_task(
            self._write_guarded(peer_id, request_id, layer, list(runs), num_bytes, sending)
        )
        sending.writes.append(task)
        return task

    async def finish_request(self, peer_id: str, request_id: str) -> RequestSent:
        """Wait for all of the request's writes, then tell the receiver they are complete
        (a backend may tell it sooner, see `_end_before_writes_complete`). Called once per
        request after its last `write_layer`; returns once every write completed, and raises
        TransferError if any failed (the receiver is then told the request is aborted)."""
        if request_id in self._sender_aborted:
            raise TransferError(peer_id, request_id, "request was aborted")
        sending = self._sending.get(request_id)
        if sending is None:
            sending = _Sending(peer_id)
        elif sending.peer_id != peer_id:
            raise ValueError(f"request {request_id!r} is being sent to {sending.peer_id!r}, not {peer_id!r}")
        writes = asyncio.gather(*sending.writes, return_exceptions=True)
        finished_early = bool(sending.writes) and await self._end_before_writes_complete(
            peer_id, request_id, sending, writes
        )
        results = await writes
        self._sending.pop(request_id, None)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self._send_end_quietly(peer_id, request_id, None)
            error = failures[0]
            if isinstance(error, TransferError):
                raise error
            raise TransferError(peer_id, request_id, f"write failed: {error!r}") from error
        if not finished_early:
            await self._guard(peer_id, request_id, self._send_end(peer_id, request_id, sending.num_bytes))
        return RequestSent(request_id, len(sending.writes), sending.num_bytes)

    def num_writes_done(self, request_id: str) -> int:
        """Writes of `request_id` completed so far (0 once it finished or was aborted): how far
        its transfer progressed."""
        sending = self._sending.get(request_id)
        return 0 if sending is None else sum(write.done() for write in sending.writes)

    async def _write_guarded(
        self, peer_id: str, request_id: str, layer: int, runs: list[BlockRun], num_bytes: int, sending: _Sending
    ) -> LayerWritten:
        await self._guard(peer_id, request_id, self._paced_write(peer_id, request_id, layer, runs, num_bytes, sending))
        if not sending.first_written:
            sending.first_written = True
            await fault_points.reached("kv.layer_written", request_id)
        return LayerWritten(request_id, layer, num_bytes)

    async def _paced_write(
        self, peer_id: str, request_id: str, layer: int, runs: list[BlockRun], num_bytes: int, sending: _Sending
    ) -> None:
        if self._limiter is not None:
            await self._limiter.acquire(num_bytes)
        if sending.aborted:
            return  # aborted before it was issued: never started, nothing to undo
        await self._write(peer_id, request_id, layer, runs)

    async def _guard(self, peer_id: str, request_id: str, operation) -> None:
        try:
            await operation
        except TransferError:
            raise
        except asyncio.CancelledError as exc:
            if peer_id in self._peers and not self._closed:
                raise  # a plain cancellation (abort), not a failure
            raise TransferError(peer_id, request_id, f"peer lost: {exc.args[0] if exc.args else 'closed'}") from None
        except (OSError, RuntimeError, ValueError, EOFError) as exc:
            raise TransferError(peer_id, request_id, f"{type(exc).__name__}: {exc}") from exc

    def _on_expect(self) -> None:
        """Receiver hook, called by `expect`: a request is now expected, so a backend that polls
        should poll at its busy pace (the sender may start any moment). Default: nothing to do."""

    async def _end_before_writes_complete(
        self, peer_id: str, request_id: str, sending: _Sending, writes: asyncio.Future
    ) -> bool:
        """Sender hook, called by `finish_request` while the request's `writes` run: a backend
        whose receiver learns by itself when the bytes landed may tell it the request's end
        now (`_send_end`) and return True; `finish_request` still waits for the writes and
        follows with an abort if one fails. Default: False (the end follows the writes)."""
        return False
