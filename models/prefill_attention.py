"""Prefill attention through minipd's float32 kernel (`prefill_attention.cpp`) instead of SDPA.

`PrefillAttention.of(model, pool_dtype)` is the kernel for an engine that can use it, else None
(`unsupported` says why): a float32 model and KV pool on the CPU whose weights one of minipd's
int8 kernel libraries ("vnni", "avx2") multiplies, as a GGUF file served quantized in float32
is; the attention kernel is built into that library. Called with one prefill chunk's queries,
it answers what SDPA with the chunk's causal mask answers (within float32 rounding: see the
.cpp's header), reading the chunk's keys from the pool's blocks, and only the keys each query
sees. A query row's output depends on that row and its keys only, not on how the prompt was
split into chunks or which other rows share the step.
"""

from __future__ import annotations

import torch

from minipd.models import vnni_kernels
from minipd.models.llama import LlamaForCausalLM
from minipd.models.quantized_linear import INT8_KERNELS


def unsupported(model: LlamaForCausalLM, pool_dtype: torch.dtype) -> str | None:
    """Why the prefill attention kernel cannot serve `model` over a pool of `pool_dtype`, or None."""
    norm = model.model.norm.weight
    if norm.device.type != "cpu" or norm.dtype != torch.float32 or pool_dtype != torch.float32:
        return f"the prefill attention kernel runs float32 on the CPU, not {norm.dtype} on {norm.device.type}"
    if model.quantized_kernel not in INT8_KERNELS:
        return "the prefill attention kernel is built with minipd's int8 kernels, which this model does not use"
    if model.config.head_dim % 16 != 0:
        return f"the prefill attention kernel takes head_dim a multiple of 16, not {model.config.head_dim}"
    return None


class PrefillAttention:
    """The kernel of one variant's library, looked up once."""

    def __init__(self, kernel: str):
        vnni_kernels.load(kernel)
        self.kernel = kernel
        self._op = getattr(torch.ops, f"minipd_{kernel}").prefill_attention

    @classmethod
    def of(cls, model: LlamaForCausalLM, pool_dtype: torch.dtype) -> PrefillAttention | None:
        return None if unsupported(model, pool_dtype) is not None else cls(model.quantized_kernel)

    def __call__(
        self, q: torch.Tensor, layer_kv: torch.Tensor, block_ids: torch.Tensor, context_len: int, scale: float
    ) -> torch.Tensor:
        """Attention [T, heads, head_dim] of a chunk's queries q ([T, heads, head_dim], the chunk's
        K/V already in the pool) over the sequence's first `context_len` tokens in `block_ids`."""
        return self._op(q, layer_kv, block_ids, context_len, scale)
