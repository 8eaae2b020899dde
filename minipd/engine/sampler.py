"""Token sampling: greedy, temperature, top-k, top-p, with per-request seeds.

A seeded request's k-th output token is drawn from a generator seeded by (seed, k), never by
batch position or generator history. So the same seed gives the same tokens whatever else is
in the batch, and a request whose first token was sampled on a prefill instance continues
identically on a decode instance without shipping generator state.
"""

from __future__ import annotations

from typing import Sequence

import torch

from minipd.engine.sampling_params import SamplingParams

_STEP_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, step) over the seed space
_SEED_SPACE = 2**64


def step_seed(seed: int, step: int) -> int:
    return (seed + (step + 1) * _STEP_MIX) % _SEED_SPACE


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        logits = logits.masked_fill(drop_sorted.scatter(0, order, drop_sorted), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], steps: Sequence[int]) -> list[int]:
    """One token per row of `logits` ([rows, vocab], float32).

    `steps[i]` is how many output tokens row i's request already has; seeds must be set.
    """
    tokens = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.is_greedy:
            continue
        row = _filter_top_k_top_p(logits[i] / p.temperature, p.top_k, p.top_p)
        gen = torch.Generator(device=logits.device).manual_seed(step_seed(p.seed, steps[i]))
        tokens[i] = int(torch.multinomial(torch.softmax(row, dim=-1), 1, generator=gen))
    return tokens
