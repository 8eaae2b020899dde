"""Attention masks of sliding-window layers (Gemma 3) over the paged KV pool.

A sliding layer's query at position p sees the keys at positions p - window + 1 .. p only (as
transformers' and llama.cpp's sliding window do). The pool keeps every block of such a layer;
these masks hide the older keys, in the shapes `paged_attention` takes: a decode group's
[count, 1, 1, max_blocks * block_size] and a prefill chunk's [whole-block queries, whole-block
keys]. Padding rows of a chunk (past its real queries) see key 0, so no row is fully masked.
"""

from __future__ import annotations

import torch


def decode_window_mask(lens: list[int], max_blocks: int, block_size: int, window: int, device) -> torch.Tensor:
    """Mask of a decode group whose sequences hold `lens` tokens (the query is each one's last)."""
    key_pos = torch.arange(max_blocks * block_size, device=device)[None, :]
    lengths = torch.tensor(lens, dtype=torch.long).to(device)[:, None]
    return ((key_pos < lengths) & (key_pos >= lengths - window)).view(len(lens), 1, 1, -1)


def chunk_window_mask(query_len: int, context_len: int, block_size: int, window: int, device) -> torch.Tensor:
    """Mask of a prefill chunk: its `query_len` queries are the last of `context_len` tokens."""
    offset = context_len - query_len
    q = torch.arange(_whole_blocks(query_len, block_size), device=device)[:, None]
    k = torch.arange(_whole_blocks(context_len, block_size), device=device)[None, :]
    visible = (k <= q + offset) & (k > q + offset - window)
    return visible | ((q >= query_len) & (k == 0))


def _whole_blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size) * block_size
