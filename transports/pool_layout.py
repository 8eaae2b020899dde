"""How a KV pool tensor maps to bytes: the only thing transports know about the KV cache."""

from __future__ import annotations

from typing import NamedTuple

import torch


class PoolLayout(NamedTuple):
    """Byte layout of a pool `[num_layers, num_blocks, ...]`: block `b` of layer `l` is the
    contiguous byte range at `offset(l, b)` of length `block_bytes`, and consecutive block
    ids of one layer are adjacent. Any dtype; dims past the second are per-block bytes."""

    num_layers: int
    num_blocks: int
    block_bytes: int
    base_address: int
    device_type: str
    device_index: int

    @classmethod
    def from_tensor(cls, pool: torch.Tensor) -> PoolLayout:
        """Read the layout of `pool`; raises ValueError if it is not one contiguous tensor of at
        least two dimensions."""
        if pool.dim() < 2:
            raise ValueError(f"KV pool must have shape [num_layers, num_blocks, ...], got {tuple(pool.shape)}")
        if not pool.is_contiguous():
            raise ValueError("KV pool must be one contiguous tensor")
        block_bytes = pool[0, 0].numel() * pool.element_size() if pool.numel() else 0
        if block_bytes == 0:
            raise ValueError(f"KV pool has empty blocks: shape {tuple(pool.shape)}")
        return cls(
            num_layers=pool.shape[0],
            num_blocks=pool.shape[1],
            block_bytes=block_bytes,
            base_address=pool.data_ptr(),
            device_type=pool.device.type,
            device_index=pool.device.index or 0,
        )

    @property
    def layer_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def offset(self, layer: int, block: int) -> int:
        """Byte offset of block `block` of layer `layer` from the start of the pool."""
        return layer * self.layer_bytes + block * self.block_bytes

    def check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} outside the pool's {self.num_layers} layers")

    def check_blocks(self, start: int, num_blocks: int, side: str) -> None:
        if num_blocks < 1 or start < 0 or start + num_blocks > self.num_blocks:
            raise ValueError(
                f"{side} blocks [{start}, {start + num_blocks}) outside the pool's {self.num_blocks} blocks"
            )


def pool_bytes(pool: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of the pool's memory (no copy); slices of it alias the pool."""
    return pool.reshape(-1).view(torch.uint8)
