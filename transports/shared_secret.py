"""The cluster's shared secret, and the HMAC proofs that show a peer knows it.

Every authenticated link (the control plane's handshake, the tcp KV link, the ucx and nixl
headers) proves knowledge of one secret without sending it: each side contributes a fresh
random nonce, and a proof is HMAC-SHA256 over a label naming who proves and for which link,
then both nonces and the identity being claimed. Labels differ per direction, so a proof one
side computed can never be replayed as the other side's. Parts are length-prefixed before
hashing, so no two different part lists hash alike.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
# Shorter secrets are refused: a captured handshake lets an attacker guess offline.
MIN_SECRET_BYTES = 16
_PART_LENGTH = struct.Struct("!I")


class SharedSecret:
    """A cluster secret; its `repr` never shows the key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_SECRET_BYTES:
            raise ValueError(
                f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes, got {len(key)}; "
                f"generate one with: python -c 'import secrets; print(secrets.token_hex(32))'"
            )
        self._key = bytes(key)
        # keyed once: each proof copies it instead of hashing the key again
        self._keyed = hmac.new(self._key, digestmod=hashlib.sha256)

    @classmethod
    def from_text(cls, text: str) -> "SharedSecret":
        return cls(text.encode())

    def proof(self, label: bytes, *parts: bytes | str | int) -> bytes:
        """HMAC-SHA256 over `label` and `parts` (str encoded as UTF-8, int as decimal text)."""
        mac = self._keyed.copy()
        for part in (label, *parts):
            data = part.encode() if isinstance(part, str) else str(part).encode() if isinstance(part, int) else part
            mac.update(_PART_LENGTH.pack(len(data)))
            mac.update(data)
        return mac.digest()

    def verify(self, proof: bytes, label: bytes, *parts: bytes | str | int) -> bool:
        """Whether `proof` is ours for these parts (constant-time comparison)."""
        return hmac.compare_digest(proof, self.proof(label, *parts))

    def __reduce__(self):  # the keyed HMAC does not pickle; the key does (process launchers, tests)
        return SharedSecret, (self._key,)

    def __repr__(self) -> str:
        return "SharedSecret(<hidden>)"


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def generate_secret_text() -> str:
    """A fresh random secret, as text fit for an environment variable."""
    return secrets.token_hex(32)
