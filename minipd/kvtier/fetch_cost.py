"""Fetch or recompute: whether blocks the shared KV tier holds are worth fetching, or faster to
compute (docs/kv-tier.md#fetch-or-recompute).

Fetching `n` blocks costs the tier's lookup and its fetch, `lookup_s + fetch_latency_s + n *
block_bytes / fetch_bandwidth`; computing them costs the prefill of their `n * block_size`
tokens at the engine's marginal cost per token (a step's time less its fixed part: the tokens
past a fetched prefix are computed anyway, so only the prefix's own tokens are saved). A small
model on a fast CPU computes a block faster than a store answers; a large one, or a long
prefix, fetches faster. `FetchCost` holds both costs as straight lines fitted online, by least
squares over exponentially decaying observations (a prior until the first few):

- the fetch: seconds of each tier fetch against its bytes (`observe_fetch`), and of each
  lookup (`observe_lookup`, its mean);
- the compute: seconds of each engine step that ran prompt tokens against its tokens
  (`observe_step`); the slope is the marginal cost of a token.

`worth_asking(n)`: is a lookup and a fetch of up to `n` blocks predicted to beat computing
them (else the tier is not asked at all); `worth_fetching(n)`: once the lookup said `n` blocks
are there, is their fetch predicted to beat computing them. A decline is counted; every
`probe_every`-th decline in a row fetches anyway, so the fit keeps seeing what a fetch costs
now (a store that got faster is noticed). `Always` fetches whatever the tier holds.
"""

from __future__ import annotations

import dataclasses
import math

# The prior: a store on this host over TCP (Redis: ~1 ms a call, ~300 MB/s; Mooncake faster)
# and an engine that computes a prompt token in 0.5 ms at the margin (a ~100M-parameter model
# on one or two CPU cores). The first observations replace it.
DEFAULT_LOOKUP_S = 1e-3
DEFAULT_FETCH_LATENCY_S = 1e-3
DEFAULT_FETCH_BYTES_PER_S = 300e6
DEFAULT_STEP_FIXED_S = 5e-3
DEFAULT_TOKEN_S = 0.5e-3
MIN_OBSERVED = 3  # observations a line needs before it replaces its prior
DECAY = 0.95  # each observation's weight, per later one (a memory of ~20 observations)
PROBE_EVERY = 16
KV_TIER_FETCH_CHOICES = ("auto", "always")  # --kv-tier-fetch


class LinearFit:
    """`y ~ intercept + slope * x` by least squares over observations whose weights decay by
    `decay` with every later one; the prior line until `MIN_OBSERVED` observations (a prior mixed
    into the fit would pull it wherever the observations are few and far from the prior's sizes).
    The slope is kept positive and the intercept at least 0: a cost that falls with size, or is
    below nothing, is noise; observations all of one size give the line through the origin and
    their mean."""

    def __init__(self, intercept: float, slope: float, decay: float = DECAY):
        if slope <= 0 or intercept < 0 or not 0 < decay <= 1:
            raise ValueError("LinearFit: a positive slope, intercept >= 0 and 0 < decay <= 1")
        self.prior, self.decay = (intercept, slope), decay
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.num_observed = 0

    def observe(self, x: float, y: float) -> None:
        if not (math.isfinite(x) and math.isfinite(y)) or x <= 0 or y < 0:
            return
        d = self.decay
        self._w, self._x, self._y = d * self._w + 1.0, d * self._x + x, d * self._y + y
        self._xx, self._xy = d * self._xx + x * x, d * self._xy + x * y
        self.num_observed += 1

    def line(self) -> tuple[float, float]:
        """(intercept, slope) of the weighted fit, or the prior."""
        if self.num_observed < MIN_OBSERVED:
            return self.prior
        w, sx, sy = self._w, self._x, self._y
        spread = w * self._xx - sx * sx
        slope = (w * self._xy - sx * sy) / spread if spread > 1e-9 * w * self._xx else 0.0
        intercept = (sy - slope * sx) / w
        if slope <= 0 or intercept < 0:  # noise, or one size only: through the origin
            return 0.0, max(self._xy / self._xx, 1e-15)
        return intercept, slope

    def predict(self, x: float) -> float:
        intercept, slope = self.line()
        return intercept + slope * x


class Mean:
    """A mean over exponentially decaying observations; the prior until the first."""

    def __init__(self, prior: float, decay: float = DECAY):
        self.prior, self.decay = prior, decay
        self._w = self._sum = 0.0

    def observe(self, value: float) -> None:
        if math.isfinite(value) and value >= 0:
            self._w = self.decay * self._w + 1.0
            self._sum = self.decay * self._sum + value

    @property
    def value(self) -> float:
        return self._sum / self._w if self._w else self.prior


@dataclasses.dataclass(frozen=True)
class CostLines:
    """The costs `FetchCost` predicts with, now (for reports and the bench)."""

    lookup_s: float
    fetch_latency_s: float
    fetch_bytes_per_s: float
    step_fixed_s: float
    token_s: float  # the marginal cost of a prompt token

    def fetch_s(self, num_blocks: int, block_bytes: int) -> float:
        return self.fetch_latency_s + num_blocks * block_bytes / self.fetch_bytes_per_s

    def compute_s(self, num_tokens: int) -> float:
        return num_tokens * self.token_s

    def break_even_blocks(self, block_bytes: int, block_size: int, lookup: bool = True) -> float:
        """The number of blocks from which fetching (with its lookup when `lookup`) is predicted
        to beat computing them; inf when it never is."""
        per_block_gain = block_size * self.token_s - block_bytes / self.fetch_bytes_per_s
        fixed = self.fetch_latency_s + (self.lookup_s if lookup else 0.0)
        return fixed / per_block_gain if per_block_gain > 0 else math.inf


class FetchCost:
    """Fetch or compute, for one instance: its pool's block (`block_bytes` of KV, `block_size`
    tokens) and its engine (see the module's docstring)."""

    def __init__(
        self,
        block_bytes: int,
        block_size: int,
        lookup_s: float = DEFAULT_LOOKUP_S,
        fetch_latency_s: float = DEFAULT_FETCH_LATENCY_S,
        fetch_bytes_per_s: float = DEFAULT_FETCH_BYTES_PER_S,
        step_fixed_s: float = DEFAULT_STEP_FIXED_S,
        token_s: float = DEFAULT_TOKEN_S,
        probe_every: int = PROBE_EVERY,
    ):
        if block_bytes <= 0 or block_size <= 0:
            raise ValueError("FetchCost: block_bytes and block_size must be positive")
        self.block_bytes, self.block_size = block_bytes, block_size
        self.probe_every = probe_every  # 0: never fetch against the prediction
        self._lookup = Mean(lookup_s)
        self._fetch = LinearFit(fetch_latency_s, 1.0 / fetch_bytes_per_s)
        self._step = LinearFit(step_fixed_s, token_s)
        self._declined_in_a_row = 0

    # ---- observations -----------------------------------------------------------------
    def observe_lookup(self, seconds: float) -> None:
        self._lookup.observe(seconds)

    def observe_fetch(self, nbytes: int, seconds: float) -> None:
        self._fetch.observe(nbytes, seconds)

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """An engine step that ran `num_tokens` rows, prompt tokens among them, in `seconds`."""
        self._step.observe(num_tokens, seconds)

    # ---- predictions ------------------------------------------------------------------
    def lines(self) -> CostLines:
        fetch_latency, seconds_per_byte = self._fetch.line()
        step_fixed, token_s = self._step.line()
        return CostLines(self._lookup.value, fetch_latency, 1.0 / seconds_per_byte, step_fixed, token_s)

    def worth_asking(self, num_blocks: int) -> bool:
        """Should the tier be asked for up to `num_blocks` blocks: would a lookup and a fetch of
        them all beat computing them."""
        lines = self.lines()
        return self._decide(lines.lookup_s + lines.fetch_s(num_blocks, self.block_bytes), lines, num_blocks)

    def worth_fetching(self, num_blocks: int) -> bool:
        """The tier has `num_blocks` blocks (the lookup is spent): would fetching them beat computing them."""
        lines = self.lines()
        return self._decide(lines.fetch_s(num_blocks, self.block_bytes), lines, num_blocks)

    def _decide(self, fetch_s: float, lines: CostLines, num_blocks: int) -> bool:
        if num_blocks <= 0:
            return False
        if fetch_s < lines.compute_s(num_blocks * self.block_size):
            self._declined_in_a_row = 0
            return True
        self._declined_in_a_row += 1
        if self.probe_every and self._declined_in_a_row >= self.probe_every:
            self._declined_in_a_row = 0
            return True  # a probe: what a fetch costs now
        return False


class Always(FetchCost):
    """Fetch whatever the tier holds (`--kv-tier-fetch always`): the tier's mechanics alone."""

    def _decide(self, fetch_s: float, lines: CostLines, num_blocks: int) -> bool:
        return num_blocks > 0


def fetch_choice(name: str, block_bytes: int, block_size: int) -> FetchCost:
    """`--kv-tier-fetch`'s choice for a pool of `block_bytes` blocks of `block_size` tokens."""
    if name not in KV_TIER_FETCH_CHOICES:
        raise ValueError(f"kv_tier_fetch: unknown {name!r}; choose one of {', '.join(KV_TIER_FETCH_CHOICES)}")
    return (Always if name == "always" else FetchCost)(block_bytes, block_size)
