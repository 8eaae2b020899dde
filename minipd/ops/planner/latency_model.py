"""Step-time models of one instance, in DistServe's form, and their least-squares fit.

- prefill step: `a + b * sum(tokens) + c * sum(q * k)`, over the prompt chunks of the batch,
  where a chunk computes `q` new tokens attending to `k` tokens (itself and what precedes
  it). For a whole prompt of `n` tokens `q = k = n`, so the last term is DistServe's
  `c * sum(len^2)`: the attention FLOPs, quadratic in the prompt.
- decode step: `a + b * sum(context) + c * batch`: the fixed cost (weights read once per
  step), the KV read (linear in the tokens attended to) and the per-sequence compute.
- a mixed step (chunked prefill: running decodes plus a prefill chunk) pays both variable
  parts and the larger fixed cost once, because the weights are read once per step
  whatever rides on it.

Fitting is non-negative least squares on relative residuals (numpy only): a negative coefficient has no physical
meaning and would make a step cheaper as it grows, which the simulator must never see.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import msgspec
import numpy as np


class PrefillModel(msgspec.Struct, frozen=True):
    a: float  # seconds per step
    b: float  # seconds per prompt token
    c: float  # seconds per (new token x attended token)

    def step_s(self, num_tokens: int, sum_qk: float) -> float:
        """Time of a prefill step computing `num_tokens` tokens whose sum of q*k is `sum_qk`."""
        return self.a + self.b * num_tokens + self.c * sum_qk

    def prompt_s(self, prompt_len: int) -> float:
        """Time of a step holding one whole prompt of `prompt_len` tokens."""
        return self.step_s(prompt_len, float(prompt_len) * prompt_len)


class DecodeModel(msgspec.Struct, frozen=True):
    a: float  # seconds per step
    b: float  # seconds per context token (summed over the batch)
    c: float  # seconds per sequence in the batch

    def step_s(self, sum_context: int, batch: int) -> float:
        return self.a + self.b * sum_context + self.c * batch


def mixed_step_s(
    prefill: PrefillModel,
    decode: DecodeModel,
    num_prefill_tokens: int,
    sum_qk: float,
    sum_context: int,
    num_decodes: int,
) -> float:
    """A chunked-prefill step: `num_decodes` decodes over `sum_context` tokens plus a prefill
    chunk; either part may be empty (a step with neither costs nothing)."""
    if num_prefill_tokens and num_decodes:
        return (
            max(prefill.a, decode.a)
            + prefill.b * num_prefill_tokens
            + prefill.c * sum_qk
            + decode.b * sum_context
            + decode.c * num_decodes
        )
    if num_prefill_tokens:
        return prefill.step_s(num_prefill_tokens, sum_qk)
    if num_decodes:
        return decode.step_s(sum_context, num_decodes)
    return 0.0


class FitStats(msgspec.Struct, frozen=True):
    """How well a fitted model explains its samples."""

    num_samples: int
    r2: float  # coefficient of determination (1 = perfect; nan when the samples do not vary)
    rmse_s: float  # root mean square residual, seconds
    max_rel_error: float  # largest |residual| / measured time


class PrefillSample(msgspec.Struct, frozen=True):
    """One measured prefill step: the prompt lengths it held and its time."""

    prompt_lens: list[int]
    seconds: float


class DecodeSample(msgspec.Struct, frozen=True):
    """One measured decode step: the batch's context lengths and its time."""

    context_lens: list[int]
    seconds: float


def nonnegative_lstsq(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """argmin ||features @ x - target|| subject to x >= 0, exactly, by trying every set of
    free coefficients (the models have three, so eight small solves). The all-zero solution
    is always feasible, so this never fails."""
    cols = features.shape[1]
    best, best_cost = np.zeros(cols), float(target @ target)
    for size in range(1, cols + 1):
        for free in itertools.combinations(range(cols), size):
            sub = features[:, free]
            solution, *_ = np.linalg.lstsq(sub, target, rcond=None)
            if np.any(solution < 0):
                continue
            residual = sub @ solution - target
            cost = float(residual @ residual)
            if cost < best_cost - 1e-18 * max(1.0, best_cost):
                best, best_cost = np.zeros(cols), cost
                best[list(free)] = solution
    return best


def _fit(features: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, FitStats]:
    if len(seconds) < features.shape[1]:
        raise ValueError(f"fit: need at least {features.shape[1]} samples, got {len(seconds)}")
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        raise ValueError("fit: every measured time must be finite and positive")
    # Relative residuals: timing noise is proportional to the time, and a 2 ms step matters
    # as much to the simulator as a 200 ms one. Each row is divided by its measured time.
    weighted = features / seconds[:, None]
    # Columns differ by orders of magnitude (1, tokens, tokens^2): scale them to unit norm so
    # the solve is well conditioned, then scale the coefficients back.
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    coef = nonnegative_lstsq(weighted / scale, np.ones_like(seconds)) / scale
    predicted = features @ coef
    residual = predicted - seconds
    total = float(np.sum((seconds - seconds.mean()) ** 2))
    stats = FitStats(
        num_samples=len(seconds),
        r2=1.0 - float(residual @ residual) / total if total > 0 else math.nan,
        rmse_s=float(np.sqrt(np.mean(residual**2))),
        max_rel_error=float(np.max(np.abs(residual) / seconds)),
    )
    return coef, stats


def fit_prefill(samples: Sequence[PrefillSample]) -> tuple[PrefillModel, FitStats]:
    return fit_prefill_terms(
        [sum(s.prompt_lens) for s in samples],
        [sum(float(n) * n for n in s.prompt_lens) for s in samples],
        [s.seconds for s in samples],
    )


def fit_prefill_terms(
    num_tokens: Sequence[int], sum_qk: Sequence[float], seconds: Sequence[float]
) -> tuple[PrefillModel, FitStats]:
    """Prefill steps given by their terms (chunks with a cached prefix included: q != k)."""
    features = np.array([[1.0, n, qk] for n, qk in zip(num_tokens, sum_qk, strict=True)])
    coef, stats = _fit(features.reshape(-1, 3), np.array(seconds, dtype=float))
    return PrefillModel(*map(float, coef)), stats


def fit_decode(samples: Sequence[DecodeSample]) -> tuple[DecodeModel, FitStats]:
    return fit_decode_terms(
        [sum(s.context_lens) for s in samples], [len(s.context_lens) for s in samples], [s.seconds for s in samples]
    )


def fit_decode_terms(
    sum_context: Sequence[int], batch: Sequence[int], seconds: Sequence[float]
) -> tuple[DecodeModel, FitStats]:
    features = np.array([[1.0, ctx, n] for ctx, n in zip(sum_context, batch, strict=True)])
    coef, stats = _fit(features.reshape(-1, 3), np.array(seconds, dtype=float))
    return DecodeModel(*map(float, coef)), stats
