"""Token-length distributions, written on the command line as `fixed:N`, `uniform:LO:HI` or
`lognormal:MEDIAN:SIGMA` (optionally `:LO:HI` to clip)."""

from __future__ import annotations

import math
import random

import msgspec

KINDS = ("fixed", "uniform", "lognormal")


class LengthDist(msgspec.Struct, frozen=True):
    """`fixed` always gives `low`; `uniform` draws from [low, high]; `lognormal` draws
    exp(N(ln median, sigma)), rounded and clipped to [low, high]."""

    kind: str
    low: int
    high: int
    median: float = 0.0
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"length distribution: unknown kind {self.kind!r}; choose one of {KINDS}")
        if not 1 <= self.low <= self.high:
            raise ValueError(f"length distribution: need 1 <= low <= high, got {self.low}, {self.high}")

    @classmethod
    def fixed(cls, n: int) -> "LengthDist":
        return cls("fixed", n, n)

    @classmethod
    def uniform(cls, low: int, high: int) -> "LengthDist":
        return cls("uniform", low, high)

    @classmethod
    def parse(cls, text: str) -> "LengthDist":
        """`fixed:128`, `uniform:32:512`, `lognormal:200:0.8` or `lognormal:200:0.8:16:2048`."""
        kind, *fields = text.split(":")
        try:
            if kind == "fixed" and len(fields) == 1:
                return cls.fixed(int(fields[0]))
            if kind == "uniform" and len(fields) == 2:
                return cls.uniform(int(fields[0]), int(fields[1]))
            if kind == "lognormal" and len(fields) in (2, 4):
                low, high = (int(fields[2]), int(fields[3])) if len(fields) == 4 else (1, 1 << 20)
                return cls("lognormal", low, high, float(fields[0]), float(fields[1]))
        except ValueError as exc:
            raise ValueError(f"length distribution {text!r}: {exc}") from None
        raise ValueError(
            f"length distribution {text!r}: expected fixed:N, uniform:LO:HI or lognormal:MEDIAN:SIGMA[:LO:HI]"
        )

    @property
    def mean(self) -> float:
        """The mean length (of the unclipped distribution for `lognormal`)."""
        if self.kind == "lognormal":
            return self.median * math.exp(self.sigma**2 / 2)
        return (self.low + self.high) / 2

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        value = round(math.exp(rng.gauss(math.log(self.median), self.sigma)))
        return min(self.high, max(self.low, value))
