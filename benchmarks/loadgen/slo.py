"""Service-level objectives, written as `vllm bench serve --goodput` writes them: `ttft:MS`,
`tpot:MS`, `e2el:MS` (milliseconds). A request is good when it succeeded and meets every
objective given; a failed request is never good.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import msgspec

from .records import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2el")
MS_PER_S = 1e3


class SLO(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Upper bounds in milliseconds; None leaves a metric unconstrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            bound = getattr(self, f"{key}_ms")
            if bound is not None and not (bound > 0 and math.isfinite(bound)):
                raise ValueError(f"slo {key}: must be a positive number of milliseconds, got {bound}")

    @classmethod
    def parse(cls, items: Iterable[str]) -> "SLO":
        """`["ttft:2000", "tpot:50"]` (the `--goodput` syntax); ValueError names the bad item."""
        bounds: dict[str, float] = {}
        for item in items:
            key, sep, value = item.partition(":")
            if not sep or key not in SLO_KEYS:
                raise ValueError(f"slo {item!r}: expected KEY:MS with KEY one of {', '.join(SLO_KEYS)}")
            if key in bounds:
                raise ValueError(f"slo {item!r}: {key} given twice")
            try:
                bounds[key] = float(value)
            except ValueError:
                raise ValueError(f"slo {item!r}: {value!r} is not a number of milliseconds") from None
        return cls(**{f"{key}_ms": ms for key, ms in bounds.items()})

    def items(self) -> list[str]:
        """Back to the `--goodput` syntax."""
        return [f"{key}:{getattr(self, f'{key}_ms'):g}" for key in SLO_KEYS if getattr(self, f"{key}_ms") is not None]

    def is_empty(self) -> bool:
        return not self.items()

    def is_met(self, record: RequestRecord) -> bool:
        if not record.success:
            return False
        measured = {"ttft": record.ttft_s, "tpot": record.tpot_s, "e2el": record.e2el_s}
        return all(
            bound is None or measured[key] * MS_PER_S <= bound
            for key in SLO_KEYS
            if (bound := getattr(self, f"{key}_ms")) is not None
        )

    def __str__(self) -> str:
        return " ".join(self.items()) or "none"


def num_good(records: Sequence[RequestRecord], slo: SLO) -> int:
    return sum(slo.is_met(r) for r in records)


def attainment(records: Sequence[RequestRecord], slo: SLO) -> float:
    """The share of all requests (failed ones included) that met `slo`; NaN for no requests."""
    if not records:
        return math.nan
    return num_good(records, slo) / len(records)
