"""Service-level objectives, written as `vllm bench serve --goodput` writes them.

`ttft:400 itl:40` (milliseconds). A request is *good* when it meets every objective given:
- `ttft`: time to first token;
- `tpot`: time per output token after the first, (last - first token time) / (tokens - 1);
- `itl`: the request's own 90th-percentile inter-token gap (so one stall does not fail a
  request, a stall every tenth token does);
- `e2el`: end-to-end latency.
A request with one output token has no gaps and meets `tpot` and `itl` trivially.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from minipd.planner.sim_result import SimResult

KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s", "e2e": "e2e_s"}


class SLO(msgspec.Struct, frozen=True):
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for field in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            value = getattr(self, field)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"slo {field}: must be a positive number of seconds, got {value}")

    @classmethod
    def parse(cls, items: Sequence[str]) -> SLO:
        """`["ttft:400", "itl:40"]` (milliseconds) -> SLO; raises ValueError naming the bad item."""
        values: dict[str, float] = {}
        for item in items:
            key, sep, ms = item.partition(":")
            if not sep or key not in KEYS:
                raise ValueError(
                    f"slo {item!r}: expected KEY:MILLISECONDS with KEY one of {sorted(set(KEYS) - {'e2e'})}"
                )
            try:
                seconds = float(ms) / 1000
            except ValueError:
                raise ValueError(f"slo {item!r}: {ms!r} is not a number of milliseconds") from None
            if not (seconds > 0 and math.isfinite(seconds)):
                raise ValueError(f"slo {item!r}: must be a positive number of milliseconds")
            values[KEYS[key]] = seconds
        return cls(**values)

    @property
    def is_empty(self) -> bool:
        return all(getattr(self, f) is None for f in ("ttft_s", "tpot_s", "itl_s", "e2e_s"))

    @property
    def decode_bound(self) -> tuple[str, float] | None:
        """The per-token objective ('itl' or 'tpot', seconds), the one decode instances answer for."""
        if self.itl_s is not None:
            return "itl", self.itl_s
        if self.tpot_s is not None:
            return "tpot", self.tpot_s
        return None

    def describe(self) -> str:
        names = {"ttft_s": "ttft", "tpot_s": "tpot", "itl_s": "itl", "e2e_s": "e2el"}
        return " ".join(f"{names[f]}:{getattr(self, f) * 1000:g}ms" for f in names if getattr(self, f) is not None)

    def good(self, result: SimResult) -> np.ndarray:
        """Per request: does it meet every objective? (All True when there are none.)"""
        ok = np.ones(result.num_requests, dtype=bool)
        for field, values in (
            ("ttft_s", result.ttft_s),
            ("tpot_s", result.tpot_s),
            ("itl_s", result.itl_p90_s),
            ("e2e_s", result.e2e_s),
        ):
            bound = getattr(self, field)
            if bound is not None:
                ok &= np.nan_to_num(values, nan=0.0) <= bound
        return ok
