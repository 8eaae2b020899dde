"""Service-level objectives in seconds, written on the command line as `vllm bench serve
--goodput` writes them: `ttft:400 itl:40` (milliseconds).

- `ttft`: time to first token;
- `tpot`: time per output token after the first, (last - first token time) / (tokens - 1);
- `itl`: the request's own 90th-percentile inter-token gap (so one stall does not fail a
  request, a stall every tenth token does);
- `e2el` (also `e2e`): end-to-end latency.
A request with one output token has no gaps and meets `tpot` and `itl` trivially.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

FIELDS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s"}  # flag key -> field
ALIASES = {"e2e": "e2el"}
MS_PER_S = 1e3
# An objective set over HTTP, in milliseconds: 1 us (below it, milliseconds in seconds could
# round to 0) to an hour (no request of a serving cluster is judged past it).
MIN_BOUND_MS, MAX_BOUND_MS = 1e-3, 3_600_000.0


def bound_ms_error(ms: object) -> str | None:
    """Why `ms` cannot be an objective in milliseconds (None: it can)."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not (MIN_BOUND_MS <= ms <= MAX_BOUND_MS):
        return f"must be a positive number of milliseconds, from {MIN_BOUND_MS:g} to {MAX_BOUND_MS:.0f}, got {ms!r}"
    return None


class SLO(msgspec.Struct, frozen=True, omit_defaults=True):
    """Upper bounds in seconds; None leaves a metric unconstrained."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for field in FIELDS.values():
            value = getattr(self, field)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"slo {field}: must be a positive number of seconds, got {value}")

    @classmethod
    def parse(cls, items: Iterable[str]) -> SLO:
        """`["ttft:400", "itl:40"]` (milliseconds) -> SLO; raises ValueError naming the bad item."""
        values: dict[str, float] = {}
        for item in items:
            key, sep, ms = item.partition(":")
            key = ALIASES.get(key, key)
            if not sep or key not in FIELDS:
                raise ValueError(f"slo {item!r}: expected KEY:MILLISECONDS with KEY one of {', '.join(FIELDS)}")
            if FIELDS[key] in values:
                raise ValueError(f"slo {item!r}: {key} given twice")
            try:
                seconds = float(ms) / MS_PER_S
            except ValueError:
                raise ValueError(f"slo {item!r}: {ms!r} is not a number of milliseconds") from None
            if not (seconds > 0 and math.isfinite(seconds)):
                raise ValueError(f"slo {item!r}: must be a positive number of milliseconds")
            values[FIELDS[key]] = seconds
        return cls(**values)

    def bounds(self) -> dict[str, float]:
        """The objectives given, flag key -> seconds, in flag order."""
        return {key: getattr(self, field) for key, field in FIELDS.items() if getattr(self, field) is not None}

    def items(self) -> list[str]:
        """Back to the `--goodput` syntax (milliseconds)."""
        return [f"{key}:{seconds * MS_PER_S:g}" for key, seconds in self.bounds().items()]

    def as_ms(self) -> dict[str, float]:
        """The benchmarks' JSON form: `{"ttft_ms": 2000.0, ...}`, the objectives given only."""
        return {f"{key}_ms": seconds * MS_PER_S for key, seconds in self.bounds().items()}

    @property
    def is_empty(self) -> bool:
        return not self.bounds()

    @property
    def decode_bound(self) -> tuple[str, float] | None:
        """The per-token objective ('itl' or 'tpot', seconds), the one decode instances answer for."""
        if self.itl_s is not None:
            return "itl", self.itl_s
        if self.tpot_s is not None:
            return "tpot", self.tpot_s
        return None

    def describe(self) -> str:
        """`ttft:400ms itl:40ms`, for tables and results."""
        return " ".join(f"{key}:{seconds * MS_PER_S:g}ms" for key, seconds in self.bounds().items())

    def __str__(self) -> str:
        return " ".join(self.items()) or "none"
