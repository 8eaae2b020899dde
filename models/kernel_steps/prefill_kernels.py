"""minipd's float32 kernels for prefill chunks, instead of torch's ops around the int8 matmuls.

`PrefillKernels.of(model, pool_dtype)` is them for an engine that can use them, else None
(`unsupported` says why): a float32 model and KV pool on the CPU whose weights one of minipd's
int8 kernel libraries ("vnni", "avx2") multiplies, as a GGUF file served quantized in float32
is; these kernels are built into that library. They are:
- `attention` (kernels/prefill_attention.cpp): a chunk's causal attention over the paged pool, what
  SDPA with the chunk's mask answers (within float32 rounding), reading each query's keys, and
  only those, from the pool's blocks;
- `rms_norm` and `silu_mul` (kernels/row_ops.cpp): the layer's norms and its MLP's SiLU(gate) * up, one
  pass over the rows each instead of several torch ops.
Each output row depends on that row (and, for attention, its keys) only, not on how the prompt
was split into chunks or which other rows share the step: a prompt prefilled whole, in chunks
or after a cached prefix gets the same bits.
"""

from __future__ import annotations

import torch

from minipd.models.arch.llama import LlamaForCausalLM
from minipd.models.kernels import vnni_kernels
from minipd.models.weights.quantized_linear import INT8_KERNELS


def unsupported(model: LlamaForCausalLM, pool_dtype: torch.dtype) -> str | None:
    """Why the prefill kernels cannot serve `model` over a pool of `pool_dtype`, or None."""
    if model.config.sliding_window is not None:
        return "sliding-window attention (Gemma 3) runs through torch's ops only"
    norm = model.model.norm.weight
    if norm.device.type != "cpu" or norm.dtype != torch.float32 or pool_dtype != torch.float32:
        return (
            "the prefill kernels run float32 on the CPU, "
            f"not {norm.dtype} weights and a {pool_dtype} KV pool on {norm.device.type}"
        )
    if model.quantized_kernel not in INT8_KERNELS:
        return "the prefill kernels are built with minipd's int8 kernels, which this model does not use"
    c = model.config
    if c.head_dim % 16 or c.hidden_size % 8 or c.intermediate_size % 8:
        return "the prefill kernels take head_dim a multiple of 16 and hidden and intermediate sizes of 8"
    return None


class PrefillKernels:
    """The kernels of one variant's library, looked up once."""

    def __init__(self, kernel: str):
        vnni_kernels.load(kernel)
        self.kernel = kernel
        ops = getattr(torch.ops, f"minipd_{kernel}")
        self._attention, self._rms_norm, self._silu_mul = ops.prefill_attention, ops.rms_norm, ops.silu_mul

    @classmethod
    def of(cls, model: LlamaForCausalLM, pool_dtype: torch.dtype) -> PrefillKernels | None:
        return None if unsupported(model, pool_dtype) is not None else cls(model.quantized_kernel)

    def attention(
        self, q: torch.Tensor, layer_kv: torch.Tensor, block_ids: torch.Tensor, context_len: int, scale: float
    ) -> torch.Tensor:
        """Attention [T, heads, head_dim] of a chunk's queries q ([T, heads, head_dim], the chunk's
        K/V already in the pool) over the sequence's first `context_len` tokens in `block_ids`."""
        return self._attention(q, layer_kv, block_ids, context_len, scale)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """weight * x / sqrt(mean(x^2) + eps) per row of x [T, hidden]."""
        return self._rms_norm(x, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of gate_up [T, 2 * intermediate] (gate first): [T, intermediate]."""
        return self._silu_mul(gate_up)
