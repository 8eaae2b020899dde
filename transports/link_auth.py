"""Authentication of the KV data plane with the cluster secret.

tcp: a mutual HMAC challenge opens every link (`Challenge` -> `Hello` with the sender's
proof -> `HelloAck` with the receiver's, or `Refused`). The sender's proof covers the peer
id it claims, so the receiver binds that identity to the authenticated connection and
attributes every later frame on it to that peer; the ledger then accepts writes only into
reservations naming that peer.

ucx and nixl: a connectionless header (a ucx envelope, a nixl notification) carries its own
proof over its bytes (`HeaderSeal`), so a header forged by a process without the secret is
dropped before the receiver posts a receive for it or counts a byte as landed. What this
cannot stop: a nixl WRITE is one-sided, so whoever holds a decode instance's agent metadata
can write its registered pool; and a ucx payload is matched by tag. Both need the peer's
worker address or agent metadata, which travel only inside the authenticated control plane
(or are read from the process by someone who may ptrace it, i.e. its own user or root).
A sealed header has no freshness: replaying one needs to observe the shared-memory traffic,
which again only the user itself or root can.
Without a secret, every proof is empty and nothing is checked (the behaviour before
authentication existed).
"""

from __future__ import annotations

from minipd.transports.shared_secret import PROOF_BYTES, SharedSecret

SENDER_LABEL = b"minipd kv link sender v1"
RECEIVER_LABEL = b"minipd kv link receiver v1"
HEADER_LABEL = b"minipd kv header v1"


def sender_proof(
    secret: SharedSecret | None, challenge: bytes, nonce: bytes, peer_id: str, num_layers: int, block_bytes: int
) -> bytes:
    if secret is None:
        return b""
    return secret.proof(SENDER_LABEL, challenge, nonce, peer_id, num_layers, block_bytes)


def receiver_proof(secret: SharedSecret | None, challenge: bytes, nonce: bytes, peer_id: str) -> bytes:
    if secret is None:
        return b""
    return secret.proof(RECEIVER_LABEL, challenge, nonce, peer_id)


class HeaderSeal:
    """Appends a proof to a header's bytes and checks it on arrival (nothing without a secret)."""

    def __init__(self, secret: SharedSecret | None) -> None:
        self._secret = secret

    @property
    def overhead(self) -> int:
        return PROOF_BYTES if self._secret is not None else 0

    def seal(self, body: bytes, sender_id: str = "") -> bytes:
        """`body` with its proof appended; `sender_id` names the sender where the body does not
        (a nixl notification's agent name)."""
        if self._secret is None:
            return body
        return body + self._secret.proof(HEADER_LABEL, sender_id, body)

    def open(self, data: bytes | memoryview, sender_id: str = "") -> bytes | memoryview | None:
        """The header body if `data` is authentic for `sender_id`, else None."""
        if self._secret is None:
            return data
        if len(data) < PROOF_BYTES:
            return None
        body, proof = data[:-PROOF_BYTES], bytes(data[-PROOF_BYTES:])
        return body if self._secret.verify(proof, HEADER_LABEL, sender_id, bytes(body)) else None
