"""Prefill chunks reach torch's SDPA as whole blocks of queries and keys (models/arch/paged_attention.py
says why: per-shape kernels that torch keeps forever on CPUs with AMX), with the same rows out as
attention over exactly the chunk's queries and keys, and an engine serving prompts of every
length shows SDPA no other shape."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import complete, greedy

from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.model_runner import _chunk_mask
from minipd.models.arch import paged_attention
from minipd.models.arch.paged_attention import AttentionMetadata, GatherBuffers, PrefillSpan

BLOCK, KV_HEADS, HEADS, HEAD_DIM, NUM_BLOCKS = 16, 2, 6, 32, 32


def _direct(q, pool, blocks, context_len, scale):
    """Attention of a chunk's queries (the last of `context_len` positions) over exactly its keys."""
    kv = pool[blocks]
    k = kv[:, 0].flatten(0, 1)[:context_len].transpose(0, 1).unsqueeze(0)
    v = kv[:, 1].flatten(0, 1)[:context_len].transpose(0, 1).unsqueeze(0)
    offset = context_len - q.shape[0]
    mask = torch.arange(context_len)[None, :] <= torch.arange(q.shape[0])[:, None] + offset
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return o[0].transpose(0, 1)


@pytest.mark.parametrize("query_len, context_len", [(21, 21), (30, 90), (16, 48), (1, 37), (47, 47), (5, 64)])
def test_a_chunk_padded_to_whole_blocks_gives_the_rows_of_exact_attention(query_len, context_len):
    g = torch.Generator().manual_seed(query_len * 1000 + context_len)
    pool = torch.randn(NUM_BLOCKS, 2, BLOCK, KV_HEADS, HEAD_DIM, generator=g)
    blocks = torch.randperm(NUM_BLOCKS, generator=g)[: -(-context_len // BLOCK)]
    q = torch.randn(query_len, HEADS, HEAD_DIM, generator=g)
    span = PrefillSpan(
        0, query_len, context_len, blocks, _chunk_mask(query_len, context_len, BLOCK, torch.device("cpu"))
    )
    meta = AttentionMetadata(torch.zeros(0, dtype=torch.long), 0, (), (span,))
    buffers = GatherBuffers((BLOCK, KV_HEADS, HEAD_DIM), torch.float32, torch.device("cpu"))
    ours = paged_attention.paged_attention(q, pool, meta, buffers, HEAD_DIM**-0.5)
    torch.testing.assert_close(ours, _direct(q, pool, blocks, context_len, HEAD_DIM**-0.5), rtol=1e-5, atol=1e-6)


def test_an_engine_shows_sdpa_only_whole_blocks_whatever_the_prompt_lengths(monkeypatch):
    shapes: set[tuple[int, int]] = set()
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        if q.shape[-2] > 1:  # prefill chunks (a decode step's query is one row)
            shapes.add((q.shape[-2], k.shape[-2]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(paged_attention.F, "scaled_dot_product_attention", recording)

    async def serve() -> None:
        config = EngineConfig.of(
            model="tiny", dtype="bfloat16", block_size=BLOCK, max_num_batched_tokens=64, prefill_kernels=False
        )
        engine = Engine(config)
        await engine.start()
        try:
            rng = random.Random(0)
            prompts = [[rng.randrange(10, 250) for _ in range(rng.randrange(2, 300))] for _ in range(24)]
            await asyncio.gather(*(complete(engine, p, greedy(2)) for p in prompts))
        finally:
            await engine.close()

    asyncio.run(serve())
    assert len(shapes) > 3, shapes  # chunks of many lengths were prefilled
    assert all(q % BLOCK == 0 and k % BLOCK == 0 for q, k in shapes), sorted(shapes)
