"""Admission by KV capacity: a request is accepted only while the KV it may come to hold fits.

A request's *claim* is the number of blocks its prompt and every token it may generate would
fill: `min(prompt + max_tokens, max_model_len)` tokens. A server keeps the claims of its live
requests (`KVClaims`) and refuses a new one (`NoCapacity`) when the claims would exceed its
limit, `ratio x` the KV blocks it serves from. With a ratio of 1 every accepted request has room
for its whole output, so requests never wait for blocks nor get preempted; above 1 the pool is
overcommitted on the bet that requests stop early (EOS, stop strings), and the excess waits for
blocks. A request is always accepted when no other is live, so one that claims more than the
limit is not refused forever.
"""

from __future__ import annotations

import math

DEFAULT_KV_ADMISSION_RATIO = 1.0  # every accepted request has room for its whole output


class NoCapacity(RuntimeError):
    """Not enough KV capacity for a request right now; try later or elsewhere."""


def claim_blocks(num_prompt_tokens: int, max_tokens: int, max_model_len: int, block_size: int) -> int:
    """Blocks a request's prompt and its longest possible output fill."""
    return -(-min(num_prompt_tokens + max_tokens, max_model_len) // block_size)


def claim_limit(ratio: float | None, num_blocks: int) -> int | None:
    """The most blocks live requests may claim together; None (no limit) when `ratio` is None or 0."""
    return None if not ratio else math.floor(ratio * num_blocks)


def validate_ratio(ratio: float | None) -> None:
    if ratio is not None and not (math.isfinite(ratio) and ratio >= 0):
        raise ValueError(f"kv_admission_ratio: must be a number >= 0 (0 disables), got {ratio!r}")


class KVClaims:
    """The claims of live requests, by request id."""

    def __init__(self) -> None:
        self._claims: dict[str, int] = {}
        self.total = 0  # blocks claimed by live requests

    def __len__(self) -> int:
        return len(self._claims)

    def admit(self, request_id: str, blocks: int, limit: int | None) -> None:
        """Record the claim, or raise NoCapacity when it would take the total past `limit`."""
        if limit is not None and self._claims and self.total + blocks > limit:
            raise NoCapacity(
                f"KV capacity exhausted: live requests claim {self.total} of {limit} blocks and this one needs {blocks}"
            )
        self.total += blocks - self._claims.get(request_id, 0)
        self._claims[request_id] = blocks

    def release(self, request_id: str) -> None:
        """Drop a request's claim (no-op for one without)."""
        self.total -= self._claims.pop(request_id, 0)
