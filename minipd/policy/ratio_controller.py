"""The P:D ratio controller's policy: move one instance between prefill and decode, or not.

Pure (no I/O, no clock of its own): the caller feeds it measured latencies with their
timestamps and asks for a decision at any time, passing the current role counts. The
simulator calls it, and the live controller on the router is meant to call exactly this.

Per decision, over the samples of the last `window_s` seconds taken since the last move:
1. hold while `max_in_flight` moves are still draining their instance, within `cooldown_s` of
   the last move, or with fewer than `min_samples` samples on both sides (nothing to go on);
2. each side's *shortfall* is `target - attainment`, negative when it has headroom. Prefill's
   attainment is TTFT against the TTFT SLO, less the time a request waited for decode room
   (a decode pool that is full shows up as TTFT, but more prefill would make it worse).
   Decode's is the lower of the fraction of output tokens that came within the per-token SLO
   (ITL, or TPOT) of the previous one and the fraction of requests that waited at most
   `decode_wait_fraction` of the TTFT SLO for decode room. Tokens are counted as they are
   delivered, not when their request ends, so decode trouble shows within a step;
3. move a decode instance to prefill when the TTFT shortfall exceeds `hysteresis` and
   exceeds the ITL shortfall by more than `hysteresis` (and decode keeps `min_decode`);
   the mirror rule moves a prefill instance to decode; otherwise hold.
The band of width `hysteresis` is what stops flapping: after a move that fixed one side,
the other side must be clearly worse, not merely slightly below target, to undo it.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import NamedTuple

import msgspec

from minipd.slo.targets import SLO


class Move(enum.Enum):
    HOLD = "hold"
    TO_PREFILL = "decode->prefill"
    TO_DECODE = "prefill->decode"

    @property
    def moves(self) -> bool:
        return self is not Move.HOLD

    @property
    def source_role(self) -> str:
        """The role the moved instance leaves."""
        return {Move.TO_PREFILL: "decode", Move.TO_DECODE: "prefill"}[self]


# A decision's `cause`: why it moved or held, one of a fixed few (a metric label; `reason`
# says the same in words, with the figures).
CAUSE_IN_FLIGHT = "moves_in_flight"
CAUSE_COOLDOWN = "cooldown"
CAUSE_FEW_SAMPLES = "too_few_samples"
CAUSE_WITHIN_BAND = "within_hysteresis"
CAUSE_TTFT = "ttft_short"  # moved to prefill: TTFT falls short
CAUSE_DECODE = "decode_short"  # moved to decode: ITL (or TPOT) falls short
CAUSE_TTFT_AT_MIN = "ttft_short_decode_at_min"
CAUSE_DECODE_AT_MIN = "decode_short_prefill_at_min"
# every (move, cause) a decision can be
DECISION_CAUSES = (
    *((Move.HOLD, c) for c in (CAUSE_IN_FLIGHT, CAUSE_COOLDOWN, CAUSE_FEW_SAMPLES, CAUSE_WITHIN_BAND)),
    *((Move.HOLD, c) for c in (CAUSE_TTFT_AT_MIN, CAUSE_DECODE_AT_MIN)),
    (Move.TO_PREFILL, CAUSE_TTFT),
    (Move.TO_DECODE, CAUSE_DECODE),
)


class Decision(NamedTuple):
    time_s: float
    move: Move
    reason: str
    ttft_attainment: float  # nan when not measured
    decode_attainment: float
    cause: str = CAUSE_WITHIN_BAND  # one of the CAUSE_ constants


class ControllerConfig(msgspec.Struct, frozen=True, kw_only=True):
    slo: SLO  # needs ttft and one of itl / tpot
    target: float = 0.9  # attainment each metric should reach
    hysteresis: float = 0.05
    window_s: float = 30.0
    cooldown_s: float = 30.0  # at least this long between two moves
    min_samples: int = 20
    min_prefill: int = 1
    min_decode: int = 1
    max_in_flight: int = 1  # moves whose instance is still draining, at most
    decode_wait_fraction: float = 0.5  # of the TTFT SLO: a longer wait for decode room counts against decode

    def __post_init__(self) -> None:
        if self.slo.ttft_s is None or self.slo.decode_bound is None:
            raise ValueError("controller slo: needs a ttft objective and an itl or tpot objective")
        if not 0 < self.target <= 1:
            raise ValueError(f"controller target: must be in (0, 1], got {self.target}")
        if not 0 < self.decode_wait_fraction <= 1:
            raise ValueError(f"controller decode_wait_fraction: must be in (0, 1], got {self.decode_wait_fraction}")
        if not 0 <= self.hysteresis < 1:
            raise ValueError(f"controller hysteresis: must be in [0, 1), got {self.hysteresis}")
        for field in ("window_s", "cooldown_s"):
            if not getattr(self, field) > 0:
                raise ValueError(f"controller {field}: must be positive, got {getattr(self, field)}")
        if self.max_in_flight < 1:
            raise ValueError(f"controller max_in_flight: must be >= 1, got {self.max_in_flight}")
        for field in ("min_samples", "min_prefill", "min_decode"):
            if getattr(self, field) < 0:
                raise ValueError(f"controller {field}: must be >= 0, got {getattr(self, field)}")


class RatioController:
    def __init__(self, config: ControllerConfig):
        self.config = config
        self._ttft_bound = config.slo.ttft_s
        self._decode_kind, self._decode_bound = config.slo.decode_bound
        self._ttft: deque[tuple[float, bool]] = deque()  # (time, met the SLO)
        self._tokens: deque[tuple[float, int, int]] = deque()  # (time, tokens within the bound, tokens)
        self._tokens_ok = self._tokens_all = 0
        self._decode_wait: deque[tuple[float, bool]] = deque()
        self._last_move_s: float | None = None
        self.decisions: list[Decision] = []  # every decision that moved

    def observe_ttft(self, now: float, ttft_s: float, decode_wait_s: float = 0.0) -> None:
        """One request's first token: its TTFT, of which `decode_wait_s` waiting for KV room
        on a decode instance (the router knows: it is the wait for the reservation)."""
        self._ttft.append((now, ttft_s - decode_wait_s <= self._ttft_bound))
        self._decode_wait.append((now, decode_wait_s <= self.config.decode_wait_fraction * self._ttft_bound))

    @property
    def ttft_bound_s(self) -> float:
        return self._ttft_bound

    def observe_late(self, now: float, decode_wait_s: float) -> None:
        """A request has waited the whole TTFT SLO without a first token (the router knows
        this before the token comes, so an overload shows at once): the TTFT is missed, by
        prefill unless the request spent over `decode_wait_fraction` of it waiting for decode
        room. Its first token, when it comes, is not to be observed again."""
        decode_ok = decode_wait_s <= self.config.decode_wait_fraction * self._ttft_bound
        self._decode_wait.append((now, decode_ok))
        if decode_ok:
            self._ttft.append((now, False))

    def observe_tokens(self, now: float, gap_s: float, count: int = 1) -> None:
        """`count` output tokens delivered now, each `gap_s` after its request's previous one."""
        ok = count if gap_s <= self._decode_bound else 0
        self._tokens.append((now, ok, count))
        self._tokens_ok += ok
        self._tokens_all += count

    def note_pool_change(self, now: float) -> None:
        """A pool changed size (an instance added or removed, pool_scaling.py): the samples
        before it judged other pools, so the window starts afresh, and the cool-down too."""
        self._last_move_s = now

    def window_start(self, now: float) -> float:
        """Where the samples the next decision weighs begin: `window_s` ago, or at the last move."""
        start = now - self.config.window_s
        return start if self._last_move_s is None else max(start, self._last_move_s)

    def _token_attainment(self, now: float) -> tuple[float, int]:
        start = self.window_start(now)
        tokens = self._tokens
        while tokens and tokens[0][0] < start:
            _, ok, count = tokens.popleft()
            self._tokens_ok -= ok
            self._tokens_all -= count
        if not self._tokens_all:
            return float("nan"), 0
        return self._tokens_ok / self._tokens_all, len(tokens)

    def _attainment(self, samples: deque, now: float) -> tuple[float, int]:
        start = self.window_start(now)
        while samples and samples[0][0] < start:
            samples.popleft()
        if not samples:
            return float("nan"), 0
        return sum(ok for _, ok in samples) / len(samples), len(samples)

    def decide(self, now: float, num_prefill: int, num_decode: int, moves_in_flight: int = 0) -> Decision:
        """`num_prefill` and `num_decode` count instances serving in each role now (draining
        ones excluded); `moves_in_flight` the instances draining or between roles."""
        c = self.config
        ttft, n_ttft = self._attainment(self._ttft, now)
        dec, n_dec = self._token_attainment(now)
        wait, n_wait = self._attainment(self._decode_wait, now)
        if n_wait and (not n_dec or wait < dec):
            dec, n_dec = wait, max(n_dec, n_wait)
        if moves_in_flight >= c.max_in_flight:
            return Decision(now, Move.HOLD, "moves in flight", ttft, dec, CAUSE_IN_FLIGHT)
        if self._last_move_s is not None and now - self._last_move_s < c.cooldown_s:
            return Decision(now, Move.HOLD, "cooling down", ttft, dec, CAUSE_COOLDOWN)
        if n_ttft < c.min_samples and n_dec < c.min_samples:
            return Decision(now, Move.HOLD, "too few samples", ttft, dec, CAUSE_FEW_SAMPLES)
        # A side with too few samples shows neither trouble nor headroom (a shortfall of 0):
        # when every request is stuck waiting for decode room, prefill has nothing to report.
        ttft_short = c.target - ttft if n_ttft >= c.min_samples else 0.0
        dec_short = c.target - dec if n_dec >= c.min_samples else 0.0
        move, reason, cause = Move.HOLD, "within the hysteresis band", CAUSE_WITHIN_BAND
        if ttft_short > c.hysteresis and ttft_short > dec_short + c.hysteresis:
            if num_decode > c.min_decode:
                move, reason = Move.TO_PREFILL, f"ttft attainment {ttft:.2f} < {self._decode_kind} {dec:.2f}"
                cause = CAUSE_TTFT
            else:
                reason, cause = "ttft fails but decode is at its minimum", CAUSE_TTFT_AT_MIN
        elif dec_short > c.hysteresis and dec_short > ttft_short + c.hysteresis:
            if num_prefill > c.min_prefill:
                move, reason = Move.TO_DECODE, f"decode attainment {dec:.2f} < ttft {ttft:.2f}"
                cause = CAUSE_DECODE
            else:
                reason, cause = f"{self._decode_kind} fails but prefill is at its minimum", CAUSE_DECODE_AT_MIN
        decision = Decision(now, move, reason, ttft, dec, cause)
        if move.moves:
            self._last_move_s = now
            self.decisions.append(decision)
        return decision
