"""`min_tokens` (vLLM's extension): no stop before a request has that many output tokens.

As in vLLM, a request whose output is still shorter than `min_tokens` cannot sample its stop
tokens (EOS, unless `ignore_eos`, and its `stop_token_ids`): their logits are set to -inf
before sampling, greedy or not, so the token drawn is the best of the others. Stop strings are
not looked for until then either (`stops_active`). The masking happens where the token is
sampled, so a prefill instance's first token and a decode instance's later ones obey it alike.
"""

from __future__ import annotations

from typing import Collection, Sequence

import torch

from minipd.engine.sampling_params import SamplingParams


def stops_active(params: SamplingParams, num_output_tokens: int) -> bool:
    """Whether an output of `num_output_tokens` tokens (the newest included) may end on a stop."""
    return num_output_tokens >= params.min_tokens


def suppress_stop_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], steps: Sequence[int], eos_token_ids: Collection[int]
) -> torch.Tensor:
    """`logits` ([rows, vocab]) with each row's stop tokens at -inf while row i's request has
    fewer than `min_tokens` output tokens (`steps[i]`, before this one); the input is returned
    untouched when no row needs it, and never modified in place."""
    vocab = logits.shape[-1]
    masked = logits
    for i, (p, step) in enumerate(zip(params, steps, strict=True)):
        if step >= p.min_tokens:
            continue
        banned = set(p.stop_token_ids) if p.ignore_eos else set(p.stop_token_ids) | set(eos_token_ids)
        banned = [t for t in banned if 0 <= t < vocab]
        if not banned:
            continue
        if masked is logits:
            masked = logits.clone()
        masked[i, banned] = float("-inf")
    return masked
