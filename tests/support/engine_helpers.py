"""Shared helpers for engine tests: collecting a request's whole output, and a reference decoder."""

from __future__ import annotations

import asyncio

import torch

from minipd.engine.engine import Engine
from minipd.engine.request import RequestOutput
from minipd.engine.sampling_params import SamplingParams


class Completion:
    def __init__(self, outputs: list[RequestOutput]):
        self.outputs = outputs
        self.token_ids = [t for o in outputs for t in o.token_ids]
        self.text = "".join(o.text for o in outputs)
        self.finish_reason = outputs[-1].finish_reason
        self.num_cached_tokens = outputs[-1].num_cached_tokens


async def complete(engine: Engine, prompt, params: SamplingParams, request_id: str | None = None) -> Completion:
    return Completion([out async for out in engine.generate(prompt, params, request_id)])


async def complete_all(engine: Engine, prompts, params: SamplingParams) -> list[Completion]:
    return list(await asyncio.gather(*(complete(engine, p, params) for p in prompts)))


def reference_greedy(engine: Engine, token_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation by full recomputation without any cache (the oracle)."""
    device = engine.device
    out: list[int] = []
    for _ in range(max_tokens):
        logits = engine.model.forward_reference(torch.tensor(token_ids + out, device=device))
        out.append(int(logits[-1].argmax()))
    return out


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
