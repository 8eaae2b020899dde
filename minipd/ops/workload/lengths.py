"""Token-length distributions, written on the command line as `fixed:N`, `uniform:LO:HI` or
`lognormal:MEDIAN:SIGMA` (optionally `:LO:HI` to clip).

Every distribution is checked when built, so that no draw can overflow: lengths are whole
numbers in [1, MAX_TOKENS]; a lognormal's median is a finite number in (0, MAX_TOKENS] and
its sigma a finite number in [0, MAX_SIGMA]. A draw is clipped in log space before `exp`, so
even the largest sigma gives a length in [low, high]. A lognormal written without `:LO:HI`
(`open_ended`) is clipped to [1, MAX_TOKENS]; a server that runs it fits it to its model
(minipd/ops/loadgen/builtin_load.py).
"""

from __future__ import annotations

import math
import random

import msgspec

KINDS = ("fixed", "uniform", "lognormal")
MAX_TOKENS = 1 << 20  # the longest length a distribution may give: 1,048,576 tokens
# A lognormal's widest spread: its mean is then exp(MAX_SIGMA^2 / 2), about 270,000 times its
# median, already no model of prompt or answer lengths (those measured have sigma 0.5 to 1.5).
MAX_SIGMA = 5.0


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
        if not 1 <= self.low <= self.high <= MAX_TOKENS:
            raise ValueError(
                f"length distribution: need 1 <= low <= high <= {MAX_TOKENS} tokens, got {self.low}, {self.high}"
            )
        if self.kind == "lognormal":
            if not (math.isfinite(self.median) and 0 < self.median <= MAX_TOKENS):
                raise ValueError(f"length distribution: the median must be in (0, {MAX_TOKENS}], got {self.median}")
            if not (math.isfinite(self.sigma) and 0 <= self.sigma <= MAX_SIGMA):
                raise ValueError(f"length distribution: sigma must be in [0, {MAX_SIGMA:g}], got {self.sigma}")

    @classmethod
    def fixed(cls, n: int) -> "LengthDist":
        return cls("fixed", n, n)

    @classmethod
    def uniform(cls, low: int, high: int) -> "LengthDist":
        return cls("uniform", low, high)

    @classmethod
    def parse(cls, text: str) -> "LengthDist":
        """`fixed:128`, `uniform:32:512`, `lognormal:200:0.8` or `lognormal:200:0.8:16:2048`;
        ValueError naming the text for anything else, or for parameters out of range."""
        kind, *fields = text.split(":")
        try:
            if kind == "fixed" and len(fields) == 1:
                return cls.fixed(int(fields[0]))
            if kind == "uniform" and len(fields) == 2:
                return cls.uniform(int(fields[0]), int(fields[1]))
            if kind == "lognormal" and len(fields) in (2, 4):
                low, high = (int(fields[2]), int(fields[3])) if len(fields) == 4 else (1, MAX_TOKENS)
                return cls("lognormal", low, high, float(fields[0]), float(fields[1]))
        except ValueError as exc:
            raise ValueError(f"length distribution {text[:100]!r}: {exc}") from None
        raise ValueError(
            f"length distribution {text[:100]!r}: expected fixed:N, uniform:LO:HI or lognormal:MEDIAN:SIGMA[:LO:HI]"
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
        log_value = rng.gauss(math.log(self.median), self.sigma)
        value = round(math.exp(min(log_value, math.log(self.high) + 1)))  # clipped before exp: no overflow
        return min(self.high, max(self.low, value))


def open_ended(text: str) -> bool:
    """A lognormal written without `:LO:HI`: its upper bound is for its user to fit."""
    kind, *fields = text.split(":")
    return kind == "lognormal" and len(fields) == 2
