"""Paged attention over a block-table KV pool, in plain torch (device-agnostic).

Pool layout of one layer (a view of the instance's pool): `[num_blocks, 2, block_size,
num_kv_heads, head_dim]`; index 0 of dim 1 is K, 1 is V. A step's tokens are flattened:
the decode tokens come first (one per sequence), then each prefill chunk's tokens.

The model runner builds one `AttentionMetadata` per step; every layer reuses it. A model with
sliding-window layers (Gemma 3) gets, in `sliding`, the same step with masks that also hide the
keys older than the window; the pool keeps every block of such a layer all the same (no memory
is saved yet), the masks alone make it slide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F


class PrefillSpan(NamedTuple):
    """One sequence's chunk of new tokens inside the flattened step."""

    query_start: int  # index of its first token in the step
    query_len: int  # new tokens in this chunk
    context_len: int  # tokens in the cache after this step (cached prefix + chunk)
    block_ids: torch.Tensor  # [ceil(context_len / block_size)] int64, on the pool's device
    # [query_len, context_len] bool, each rounded up to whole blocks (see `paged_attention`);
    # None means plain causal
    mask: torch.Tensor | None


class DecodeGroup(NamedTuple):
    """Decode tokens [start, start + count) of the step, whose contexts are gathered side by
    side, each padded to `max_blocks` blocks (the group's longest)."""

    start: int
    count: int
    block_table: torch.Tensor  # [count * max_blocks] int64, padded with any valid id
    max_blocks: int
    mask: torch.Tensor | None  # [count, 1, 1, max_blocks * block_size] bool; None: no padding to hide


class AttentionMetadata(NamedTuple):
    """Where a step's new K/V go and what each query attends to."""

    slot_rows: torch.Tensor  # [2T] int64: rows of `kv_rows_view` for each token's new K (first T), then its V
    num_decodes: int  # the first num_decodes tokens are single-token decode steps
    decode_groups: tuple[DecodeGroup, ...]  # covering the decode tokens in order
    prefills: tuple[PrefillSpan, ...]
    # The same step for the sliding-window layers (masks that hide keys older than the window);
    # None for a model without them.
    sliding: AttentionMetadata | None = None


# A prefill chunk's attention from the pool: (q, layer_kv, block_ids, context_len, scale) -> out,
# as SDPA with the chunk's causal mask answers it (kernel_steps/prefill_kernels.py).
PrefillKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]


class EagerKernels(Protocol):
    """Kernels an eager step may run its prefill attention, norms and SiLU through instead of
    torch's ops (prefill_kernels.PrefillKernels is minipd's)."""

    def attention(
        self, q: torch.Tensor, layer_kv: torch.Tensor, block_ids: torch.Tensor, context_len: int, scale: float
    ) -> torch.Tensor: ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...


class GatherBuffers:
    """Preallocated K and V gather buffers for batched decode, grown on demand (never shrunk).

    Paged decode must gather each sequence's blocks into one contiguous run; allocating that
    every layer of every step costs page faults, so the buffers live as long as the runner.
    """

    def __init__(self, block_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self._block_shape = block_shape  # (block_size, kv_heads, head_dim)
        self._dtype, self._device = dtype, device
        self._k = torch.empty((0, *block_shape), dtype=dtype, device=device)
        self._v = torch.empty_like(self._k)

    def get(self, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        if num_blocks > self._k.shape[0]:
            capacity = max(num_blocks, 2 * self._k.shape[0])
            self._k = torch.zeros((capacity, *self._block_shape), dtype=self._dtype, device=self._device)
            self._v = torch.zeros_like(self._k)
        return self._k[:num_blocks], self._v[:num_blocks]


def slot_rows(blocks: list[int], offsets: list[int], block_size: int) -> list[int]:
    """`AttentionMetadata.slot_rows` of tokens going to (blocks[i], offsets[i]): in the layer's
    rows view, block b's K rows start at 2 * b * block_size and its V rows block_size later."""
    k_rows = [2 * b * block_size + o for b, o in zip(blocks, offsets)]
    return k_rows + [r + block_size for r in k_rows]


def kv_rows_view(layer_kv: torch.Tensor) -> torch.Tensor:
    """One layer's pool as [num_blocks * 2 * block_size, kv_heads * head_dim] rows (a view)."""
    return layer_kv.view(-1, layer_kv.shape[-2] * layer_kv.shape[-1])


def write_kv(layer_kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> None:
    """Store the step's new K/V ([T, kv_heads, head_dim]) into their slots: one row copy for all
    of them (an advanced-indexing assignment costs several ops more, on every layer)."""
    kv_rows_view(layer_kv).index_copy_(0, meta.slot_rows, torch.cat((k.flatten(1), v.flatten(1))))


def paged_attention(
    q: torch.Tensor,
    layer_kv: torch.Tensor,
    meta: AttentionMetadata,
    buffers: GatherBuffers,
    scale: float,
    prefill: PrefillKernel | None = None,
) -> torch.Tensor:
    """Attention of q ([T, heads, head_dim]) over the cached K/V; returns [T, heads, head_dim].
    Prefill chunks go through `prefill` when given, else SDPA over their gathered blocks.

    The step's own K/V must already be written (see `write_kv`).
    """
    if not meta.prefills and len(meta.decode_groups) == 1:  # a decode-only step: no output to assemble
        return _decode_attention(q, layer_kv, meta.decode_groups[0], buffers, scale)
    out = torch.empty_like(q)
    for group in meta.decode_groups:  # one after another, so they share the gather buffers
        out[group.start : group.start + group.count] = _decode_attention(
            q[group.start : group.start + group.count], layer_kv, group, buffers, scale
        )
    for span in meta.prefills:
        end = span.query_start + span.query_len
        if prefill is not None:
            chunk_q = q[span.query_start : end]
            out[span.query_start : end] = prefill(chunk_q, layer_kv, span.block_ids, span.context_len, scale)
            continue
        kv = layer_kv[span.block_ids]  # [blocks, 2, block_size, kv_heads, head_dim]: keys to whole blocks
        k = kv[:, 0].flatten(0, 1).transpose(0, 1).unsqueeze(0)
        v = kv[:, 1].flatten(0, 1).transpose(0, 1).unsqueeze(0)
        qp = _whole_block_queries(q[span.query_start : end], layer_kv.shape[2]).transpose(0, 1).unsqueeze(0)
        op = F.scaled_dot_product_attention(
            qp, k, v, attn_mask=span.mask, is_causal=span.mask is None, scale=scale, enable_gqa=True
        )
        out[span.query_start : end] = op[0, :, : span.query_len].transpose(0, 1)
    return out


def _whole_block_queries(q: torch.Tensor, block_size: int) -> torch.Tensor:
    """`q` ([T, heads, head_dim]) with zero rows appended up to whole blocks.

    Why SDPA sees whole blocks of queries and keys: on CPUs with AMX, its bfloat16 flash kernel
    multiplies through oneDNN micro-kernels that torch builds per (query rows, key rows) shape
    of each tile and keeps for the life of the thread, never evicting one (`cpublas::brgemm`'s
    kernel cache). Chunks of any length gave new shapes without end, and an instance's memory
    grew with every new prompt length; in whole blocks the shapes are a few hundred at most.
    A real query sees no padded key (the mask, or the causal diagonal, stops it), and the padded
    queries' rows are dropped."""
    padding = -q.shape[0] % block_size
    if padding == 0:
        return q
    return torch.cat((q, q.new_zeros(padding, *q.shape[1:])))


def _decode_attention(
    q: torch.Tensor, layer_kv: torch.Tensor, group: DecodeGroup, buffers: GatherBuffers, scale: float
) -> torch.Tensor:
    """Attention of the group's single-token queries q ([count, heads, head_dim])."""
    _, _, block_size, kv_heads, head_dim = layer_kv.shape
    k_buf, v_buf = buffers.get(group.block_table.numel())
    torch.index_select(layer_kv[:, 0], 0, group.block_table, out=k_buf)
    torch.index_select(layer_kv[:, 1], 0, group.block_table, out=v_buf)
    n, seq_len = group.count, group.max_blocks * block_size
    k = k_buf.view(n, seq_len, kv_heads, head_dim).transpose(1, 2)
    v = v_buf.view(n, seq_len, kv_heads, head_dim).transpose(1, 2)
    od = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=group.mask, scale=scale, enable_gqa=True)
    return od.squeeze(2)  # [count, heads, head_dim]


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None
) -> torch.Tensor:
    """Full causal attention without a cache (the reference path): [T, heads|kv_heads, head_dim];
    with `window`, query i sees keys i - window + 1 .. i only."""
    mask = None
    if window is not None:
        pos = torch.arange(q.shape[0], device=q.device)
        mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=True,
    )
    return o[0].transpose(0, 1)
