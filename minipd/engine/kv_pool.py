"""The instance's KV pool: one preallocated tensor that every layer's paged attention reads.

Layout `[num_layers, num_blocks, 2, block_size, num_kv_heads, head_dim]` (2 = K, V): one
block of one layer is one contiguous run, and consecutive block ids are contiguous, so a
transport registers the tensor once and moves runs of blocks with single copies.
"""

from __future__ import annotations

import numpy as np
import torch

from minipd.models.arch.model_config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: unknown {name!r}; choose one of {sorted(DTYPES)}") from None


def kv_pool_shape(config: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    return (config.num_layers, num_blocks, 2, block_size, config.num_kv_heads, config.head_dim)


HUGE_PAGE_BYTES = 2 << 20


def allocate_kv_pool(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Zero-filled so every page is touched now rather than during the first transfers."""
    shape = kv_pool_shape(config, num_blocks, block_size)
    if torch.device(device).type == "cpu":
        return allocate_host_tensor(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


def allocate_host_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled host tensor, 2 MiB-aligned and backed by transparent huge pages where the
    kernel offers them (numpy advises huge pages for large buffers; torch's allocator does
    not). A pool on 4 KiB pages costs the kernel a page-table walk per 4 KiB whenever it pins
    the pool for a cross-process copy (UCX rendezvous, NIXL WRITEs): measured here, such a copy
    ran at 0.5 of memcpy between 4 KiB-page pools and 0.9-1.0 between huge-page pools."""
    num_bytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    backing = np.empty(num_bytes + HUGE_PAGE_BYTES, dtype=np.uint8)
    start = -backing.ctypes.data % HUGE_PAGE_BYTES
    flat = torch.from_numpy(backing[start : start + num_bytes])  # keeps `backing` alive
    flat.zero_()
    return flat.view(dtype).view(shape)


def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block of one layer (K and V)."""
    return 2 * block_size * config.num_kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()
