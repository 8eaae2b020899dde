"""Typed results of transport calls (no sentinel values)."""

from __future__ import annotations

from typing import NamedTuple

from minipd.transports.transfer_error import TransferError


class LayerWritten(NamedTuple):
    """One `write_layer` call finished on the sender: its source blocks may be reused."""

    request_id: str
    layer: int
    num_bytes: int


class RequestSent(NamedTuple):
    """`finish_request` returned: every write of the request was issued and completed, and the
    receiver has been told the total."""

    request_id: str
    num_writes: int
    num_bytes: int


class RequestLanded(NamedTuple):
    """On the receiver: every byte the sender wrote for the request is in the destination
    blocks, and the sender said it was done."""

    request_id: str
    peer_id: str
    num_bytes: int
    landed_at: float  # time.time() when its last byte landed (a wall clock: comparable across processes)


class ReceiveOutcome(NamedTuple):
    """What `poll_landed` reports for one request, exactly once: `landed` when it succeeded,
    `error` when it failed (exactly one of the two is set)."""

    request_id: str
    landed: RequestLanded | None
    error: TransferError | None
