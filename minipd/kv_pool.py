"""The instance's KV pool: one preallocated tensor that every layer's paged attention reads.

Layout `[num_layers, num_blocks, 2, block_size, num_kv_heads, head_dim]` (2 = K, V): one
block of one layer is one contiguous run, and consecutive block ids are contiguous, so a
transport registers the tensor once and moves runs of blocks with single copies.
"""

from __future__ import annotations

import torch

from minipd.models.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: unknown {name!r}; choose one of {sorted(DTYPES)}") from None


def kv_pool_shape(config: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    return (config.num_layers, num_blocks, 2, block_size, config.num_kv_heads, config.head_dim)


def allocate_kv_pool(config: ModelConfig, num_blocks: int, block_size: int,
                     dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zero-filled so every page is touched now rather than during the first transfers."""
    return torch.zeros(kv_pool_shape(config, num_blocks, block_size), dtype=dtype, device=device)


def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block of one layer (K and V)."""
    return 2 * block_size * config.num_kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()
