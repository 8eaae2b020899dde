"""A block of an instance's KV pool as the tier's buffers, without copies.

The pool is layer-major, `[num_layers, num_blocks, 2, block_size, kv_heads, head_dim]`
(minipd/engine/kv_pool.py): block `b` of layer `l` is one contiguous run, so a block across
the model is `num_layers` runs, one per layer, `block_bytes` each. These are views of the pool's
memory: a store reads straight from it (from Mooncake, once the pool is `register`ed, without
even a staging copy), a fetch writes straight into it.
"""

from __future__ import annotations

import torch


def block_buffers(pool: torch.Tensor, block_id: int) -> list[memoryview]:
    """The runs of block `block_id`, one per layer, in layer order: memoryviews that alias the
    pool (a CPU tensor, contiguous). ValueError for a block outside the pool."""
    if pool.device.type != "cpu" or not pool.is_contiguous():
        raise ValueError("the KV tier reads and writes a contiguous pool in host memory")
    if not 0 <= block_id < pool.shape[1]:
        raise ValueError(f"block {block_id} outside the pool's {pool.shape[1]} blocks")
    return [memoryview(pool[layer, block_id].reshape(-1).view(torch.uint8).numpy()) for layer in range(pool.shape[0])]


def pool_buffer(pool: torch.Tensor) -> memoryview:
    """The whole pool as one buffer, to `register` with the tier."""
    if pool.device.type != "cpu" or not pool.is_contiguous():
        raise ValueError("the KV tier reads and writes a contiguous pool in host memory")
    return memoryview(pool.reshape(-1).view(torch.uint8).numpy())


def pool_block_bytes(pool: torch.Tensor) -> int:
    """The bytes of one block across the model: its runs in every layer together."""
    return pool.shape[0] * pool[0, 0].numel() * pool.element_size()
