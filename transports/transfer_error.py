"""The one error a transport raises for a failed transfer."""

from __future__ import annotations


class TransferError(Exception):
    """A transfer to or from `peer_id` for `request_id` failed.

    Raised by the awaitables of `Transport.write_layer`, `finish_request`, `wait_landed` and
    `abort`, and carried in `ReceiveOutcome.error` by `poll_landed`. `request_id` is "" when
    the failure concerns the whole link (connecting, describing) rather than one request.
    After a TransferError for a request, the transport holds no reference to that request's
    blocks: the caller frees them (exactly once).
    """

    def __init__(self, peer_id: str, request_id: str, reason: str) -> None:
        self.peer_id = peer_id
        self.request_id = request_id
        self.reason = reason
        where = f"request {request_id!r} with peer {peer_id!r}" if request_id else f"peer {peer_id!r}"
        super().__init__(f"transfer of {where} failed: {reason}")
