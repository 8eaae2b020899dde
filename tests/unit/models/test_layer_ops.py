"""The decode step's trimmed layer ops give the same bits as the formulas they replace.

Each reference below is the plain form (Hugging Face's RMSNorm and rotate_half rotation, an
advanced-indexing KV write); the serving path uses fewer ops for the same values, so any
drift in rounding or indexing fails here, before it could change a token.
"""

from __future__ import annotations

import pytest
import torch

from minipd.models.arch.llama import RMSNorm
from minipd.models.arch.model_config import PRESETS
from minipd.models.arch.paged_attention import AttentionMetadata, slot_rows, write_kv
from minipd.models.arch.rope import RotaryEmbedding, apply_rope


def _hf_rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)).to(x.dtype)


def _rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_bf16_rms_norm_matches_hf_bit_for_bit(scale: float) -> None:
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(576, 1e-5).to(torch.bfloat16)
    norm.weight.data = torch.randn(576, generator=gen).to(torch.bfloat16)
    x = (torch.randn(257, 576, generator=gen) * scale).to(torch.bfloat16)
    assert torch.equal(norm(x), _hf_rms_norm(norm, x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_with_signed_sin_matches_rotate_half(dtype: torch.dtype) -> None:
    config = PRESETS["tiny"]
    rope = RotaryEmbedding(config, torch.device("cpu"), dtype)
    positions = torch.tensor([0, 1, 5, 77, config.max_position_embeddings - 1])
    x = torch.randn(len(positions), 6, config.head_dim, generator=torch.Generator().manual_seed(1)).to(dtype)
    cos, signed_sin = rope(positions)
    reference = _rotate_half_rope(x, rope.cos[positions].unsqueeze(1), rope.sin[positions].unsqueeze(1))
    assert torch.equal(apply_rope(x, cos, signed_sin), reference)
    # On a strided view too (the serving path rotates q and k as a slice of the fused qkv).
    wide = torch.randn(len(positions), 9, config.head_dim, dtype=dtype)
    wide[:, :6] = x
    assert torch.equal(apply_rope(wide[:, :6], cos, signed_sin), reference)


def test_write_kv_puts_each_token_where_advanced_indexing_does() -> None:
    blocks, block_size, kv_heads, head_dim = 7, 4, 3, 8
    gen = torch.Generator().manual_seed(2)
    pool = torch.randn(blocks, 2, block_size, kv_heads, head_dim, generator=gen)
    reference = pool.clone()
    slot_blocks, offsets = [6, 0, 3, 3, 5], [1, 3, 0, 2, 3]
    k = torch.randn(5, kv_heads, head_dim, generator=gen)
    v = torch.randn(5, kv_heads, head_dim, generator=gen)
    reference[torch.tensor(slot_blocks), :, torch.tensor(offsets)] = torch.stack((k, v), dim=1)
    meta = AttentionMetadata(torch.tensor(slot_rows(slot_blocks, offsets, block_size)), 5, (), ())
    write_kv(pool, k, v, meta)
    assert torch.equal(pool, reference)
    assert not torch.equal(pool, torch.zeros_like(pool))
