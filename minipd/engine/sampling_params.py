"""Per-request sampling parameters and their validation.

`SamplingParams` is a msgspec Struct so the router can ship it to prefill and decode
instances unchanged. `validate` raises `InvalidRequestError` naming the offending field.
"""

from __future__ import annotations

import math
import random

import msgspec

MAX_SEED = 2**63 - 1
MAX_INT = 2**63 - 1  # every integer crosses the control plane as a signed 64-bit msgpack int
# Stop conditions travel inside control-plane frames, whose cap (`minipd.control.limits`)
# counts on these bounds; OpenAI allows 4 stop strings.
MAX_STOP_BYTES = 16 << 10  # all stop strings together, UTF-8
MAX_STOP_TOKEN_IDS = 1024


class InvalidRequestError(ValueError):
    """A request the engine refuses; `field` names the offending input."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class SamplingParams(msgspec.Struct, kw_only=True):
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None  # None: the engine draws one, so the request stays reproducible
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # no stop before this many output tokens (min_tokens.py)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidRequestError("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if self.max_tokens > MAX_INT:  # the value is not echoed: it may have thousands of digits
            raise InvalidRequestError("max_tokens", "must be below 2**63")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(
                "min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}"
            )
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise InvalidRequestError("temperature", f"must be a finite number >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError("top_k", f"must be a non-negative integer (0 disables), got {self.top_k!r}")
        if self.top_k > MAX_INT:
            raise InvalidRequestError("top_k", "must be below 2**63")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise InvalidRequestError("seed", "must be in [0, 2**63)")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop", "stop strings must be non-empty strings")
        stop_bytes = sum(len(s.encode("utf-8", "surrogatepass")) for s in self.stop)
        if stop_bytes > MAX_STOP_BYTES:
            raise InvalidRequestError("stop", f"stop strings total {stop_bytes} bytes; at most {MAX_STOP_BYTES}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError("stop_token_ids", f"{len(self.stop_token_ids)} ids; at most {MAX_STOP_TOKEN_IDS}")
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            shown = [t if abs(t) <= MAX_INT else "..." for t in bad[:5]]
            raise InvalidRequestError("stop_token_ids", f"ids {shown} outside the vocabulary [0, {vocab_size})")

    def with_seed(self) -> "SamplingParams":
        """A copy whose seed is fixed (drawn now if unset)."""
        if self.seed is not None:
            return self
        return msgspec.structs.replace(self, seed=random.randrange(MAX_SEED))
