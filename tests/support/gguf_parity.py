"""What the GGUF parity tests share: transformers' model from a GGUF file, seeded random prompts,
and the largest logit difference between two models over them."""

from __future__ import annotations

from pathlib import Path

import torch

from minipd.models.arch.llama import LlamaForCausalLM

PROMPT_LENGTHS = (1, 7, 33, 100)


def from_gguf(path: Path):
    """transformers' causal LM from the GGUF file at `path` (eval mode)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()


def prompts(vocab_size: int) -> list[torch.Tensor]:
    """Random token ids of each of `PROMPT_LENGTHS`, the same on every call."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab_size, (n,), generator=gen) for n in PROMPT_LENGTHS]


def max_diff(ours, theirs, vocab_size: int) -> float:
    """Largest logit difference over `prompts`; `ours` a minipd model or a transformers one."""
    worst = 0.0
    for ids in prompts(vocab_size):
        with torch.no_grad():
            expected = theirs(ids[None]).logits[0].float()
            got = ours.forward_reference(ids) if isinstance(ours, LlamaForCausalLM) else ours(ids[None]).logits[0]
        worst = max(worst, (got.float() - expected).abs().max().item())
    return worst
