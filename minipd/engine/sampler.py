"""Token sampling: greedy, temperature, top-k, top-p, with per-request seeds.

A seeded request's k-th output token is drawn from a generator seeded by (seed, k), never by
batch position or generator history. So the same seed gives the same tokens whatever else is
in the batch, and a request whose first token was sampled on a prefill instance continues
identically on a decode instance without shipping generator state.

Numerically safe for every temperature and top_p that `SamplingParams.validate` accepts (any
finite temperature > 0, any top_p in (0, 1]): a row is scaled in float64 as its logits' gaps
to the best one, `(logits - max) / temperature`, so the best token sits at 0 and the others at
or below it (down to -inf as the temperature nears 0, where sampling becomes greedy), and top-p
always keeps the most likely token. No finite input makes a NaN of that. Rows are sampled one
by one, and a row that fails anyway (NaN logits from the model, greedy or not) is returned as a
`SamplingFailed` in its place, so one request's failure never touches the others'.
"""

from __future__ import annotations

from typing import Sequence

import torch

from minipd.engine.sampling_params import SamplingParams

_STEP_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, step) over the seed space
_SEED_SPACE = 2**64


class SamplingFailed(Exception):
    """Sampling one row failed; returned (not raised) by `sample` in that row's place."""


def step_seed(seed: int, step: int) -> int:
    return (seed + (step + 1) * _STEP_MIX) % _SEED_SPACE


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p; never the first
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop_sorted[0] = False
        logits = logits.masked_fill(drop_sorted.scatter(0, order, drop_sorted), float("-inf"))
    return logits


def scaled_logits(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """A row's logits divided by `temperature`, as float64 gaps to its best logit (<= 0)."""
    row = row.to(torch.float64)
    return (row - row.max()) / temperature


def sample_row(row: torch.Tensor, params: SamplingParams, step: int) -> int:
    """One token from one row of logits (a non-greedy request); raises on NaN logits."""
    scaled = _filter_top_k_top_p(scaled_logits(row, params.temperature), params.top_k, params.top_p)
    gen = torch.Generator(device=row.device).manual_seed(step_seed(params.seed, step))
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=gen))


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], steps: Sequence[int]) -> list[int | SamplingFailed]:
    """One token per row of `logits` ([rows, vocab]), or the row's `SamplingFailed`.

    `steps[i]` is how many output tokens row i's request already has; seeds must be set.
    """
    # One pass: max propagates NaN, so a row's maximum is NaN exactly when the row holds one.
    best, argmax = logits.max(dim=-1)
    tokens: list[int | SamplingFailed] = argmax.tolist()
    has_nan = best.isnan().tolist()
    for i, p in enumerate(params):
        if has_nan[i]:  # argmax would pick a NaN's position as if it were a token
            tokens[i] = SamplingFailed("the model produced NaN logits")
            continue
        if p.is_greedy:
            continue
        try:
            tokens[i] = sample_row(logits[i], p, steps[i])
        except RuntimeError as exc:  # torch's "probability tensor contains either inf, nan or element < 0"
            tokens[i] = SamplingFailed(f"sampling failed: {exc}")
    return tokens
