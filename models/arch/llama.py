"""Llama-architecture decoder (Llama and Qwen2 families) with paged attention.

Module and parameter names equal Hugging Face's (`model.layers.0.self_attn.q_proj.weight`,
`lm_head.weight`, ...) so a HF state dict loads without renaming.

Two entry points share the weights:
- `forward`: the serving path; writes each layer's new K/V into the paged pool, calls
  `layer_hook(i)` right after layer i's K/V is written (the pool rows of that layer are
  final from then on for the tokens of this step), and returns logits only for the rows
  that need sampling.
- `forward_reference`: full causal attention over one sequence, no cache; the oracle the
  tests compare the paged path against.

A projection is either dense (a fused bf16/f32 weight, prepacked where that helps) or, once a
loader calls `use_quantized`, a `QuantizedLinear` of 4-bit weights that replaces the dense
parameters. In weights "mixed" each 4-bit projection also holds a dense bf16 copy,
which `forward` multiplies the rows of `RowSplit.dense` by (the caller's prefill chunks); every
other row, and all of `forward_reference`, reads the 4-bit weights. `weights_format` says which.
`forward` takes `kernels` (paged_attention.EagerKernels) to run its norms, SiLU and prefill
attention through instead of torch's ops (kernel_steps/prefill_kernels.py).

Longer than 400 lines because: the architecture's modules and its two forward paths over the same weights are one
model, read together; the loaders and kernels they use live in their own modules.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from minipd.models.arch.model_config import ModelConfig
from minipd.models.arch.paged_attention import (
    AttentionMetadata,
    EagerKernels,
    GatherBuffers,
    causal_attention,
    paged_attention,
    write_kv,
)
from minipd.models.arch.rope import RotaryEmbedding, apply_rope
from minipd.models.kernels.kquant_packing import FORMATS
from minipd.models.weights import prepacked_linear, weights_summary
from minipd.models.weights.block_embedding import BlockEmbedding
from minipd.models.weights.quantized_linear import QuantizedLinear
from minipd.models.weights.row_split import RowSplit

LayerHook = Callable[[int], None]
RANDOM_LINEAR_GAIN = 2.0


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # HF normalises in float32 and casts back before the weight; match its rounding.
        # F.rms_norm without a weight is HF's x * rsqrt(mean(x^2) + eps) in one call, the same
        # bits (tests/unit/models/test_layer_ops.py) for fewer ops on every layer.
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)


def _fuse_linears(linears: list[nn.Linear], copy_values: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of linears that read the same input into one tensor,
    and re-point each linear's parameters at its slice, so one matmul replaces several while
    the HF parameter names (and in-place loading into them) keep working. Without
    `copy_values` the fused tensors are only allocated (their values are about to be loaded)."""

    def fused(parts: list[torch.Tensor]) -> torch.Tensor:
        if copy_values:
            return torch.cat(parts)
        return torch.empty(
            (sum(p.shape[0] for p in parts), *parts[0].shape[1:]), dtype=parts[0].dtype, device=parts[0].device
        )

    weight = fused([m.weight.data for m in linears])
    bias = fused([m.bias.data for m in linears]) if linears[0].bias is not None else None
    start = 0
    for m in linears:
        end = start + m.out_features
        m.weight.data = weight[start:end]
        if bias is not None:
            m.bias.data = bias[start:end]
        start = end
    return weight, bias


class _BiasOnly(nn.Module):
    """A projection's bias kept where its weight is served quantized (its parameter name unchanged)."""

    def __init__(self, bias: nn.Parameter):
        super().__init__()
        self.bias = bias


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=False)
        self.scale = d**-0.5
        self.qkv_weight: torch.Tensor | None = None
        self.qkv_bias: torch.Tensor | None = None
        self.packed_qkv: torch.Tensor | None = None  # see weights/prepacked_linear.py
        self.packed_o: torch.Tensor | None = None
        self.quant_qkv: QuantizedLinear | None = None  # see weights/quantized_linear.py
        self.quant_o: QuantizedLinear | None = None

    def fuse(self, copy_values: bool = True) -> None:
        self.qkv_weight, self.qkv_bias = _fuse_linears([self.q_proj, self.k_proj, self.v_proj], copy_values)

    def use_quantized(self, qkv: QuantizedLinear | None, o: QuantizedLinear | None) -> None:
        """Serve q/k/v and/or o from quantized weights; their dense weights are dropped. q/k/v's
        biases (qwen2) stay, under their names (`q_proj.bias`, ...), views of `qkv_bias`, which
        is added to the quantized product."""
        if qkv is not None:
            self.quant_qkv, self.qkv_weight = qkv, None
            biases = [m.bias for m in (self.q_proj, self.k_proj, self.v_proj)]
            del self.q_proj, self.k_proj, self.v_proj
            if self.qkv_bias is not None:
                self.q_proj, self.k_proj, self.v_proj = (_BiasOnly(b) for b in biases)
        if o is not None:
            self.quant_o = o
            del self.o_proj

    def prepack(self) -> None:
        if self.quant_qkv is None:
            self.packed_qkv = prepacked_linear.prepack(self.qkv_weight)
        if self.quant_o is None:
            self.packed_o = prepacked_linear.prepack(self.o_proj.weight)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, rows: RowSplit | None = None):
        """Projected q [T, heads, d], rotated k and v [T, kv_heads, d]."""
        t, heads, kv_heads, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if self.quant_qkv is not None:
            qkv = self.quant_qkv.forward(x, rows)
            if self.qkv_bias is not None:
                qkv = qkv + self.qkv_bias
        else:
            qkv = prepacked_linear.linear(x, self.qkv_weight, self.qkv_bias, self.packed_qkv)
        qkv = qkv.view(t, heads + 2 * kv_heads, d)
        qk = apply_rope(qkv[:, : heads + kv_heads], cos, signed_sin)  # q and k rotated in one go
        return qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]

    def output(self, o: torch.Tensor, rows: RowSplit | None = None) -> torch.Tensor:
        """o_proj of the attention output [T, heads * d]."""
        if self.quant_o is not None:
            return self.quant_o.forward(o, rows)
        return prepacked_linear.linear(o, self.o_proj.weight, None, self.packed_o)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_weight: torch.Tensor | None = None
        self.packed_gate_up: torch.Tensor | None = None  # see weights/prepacked_linear.py
        self.packed_down: torch.Tensor | None = None
        self.quant_gate_up: QuantizedLinear | None = None  # see weights/quantized_linear.py
        self.quant_down: QuantizedLinear | None = None

    def fuse(self, copy_values: bool = True) -> None:
        self.gate_up_weight, _ = _fuse_linears([self.gate_proj, self.up_proj], copy_values)

    def use_quantized(self, gate_up: QuantizedLinear | None, down: QuantizedLinear | None) -> None:
        """Serve gate/up and/or down from 4-bit weights; their dense weights are dropped."""
        if gate_up is not None:
            self.quant_gate_up, self.gate_up_weight = gate_up, None
            del self.gate_proj, self.up_proj
        if down is not None:
            self.quant_down = down
            del self.down_proj

    def prepack(self) -> None:
        if self.quant_gate_up is None:
            self.packed_gate_up = prepacked_linear.prepack(self.gate_up_weight)
        if self.quant_down is None:
            self.packed_down = prepacked_linear.prepack(self.down_proj.weight)

    def forward(
        self, x: torch.Tensor, rows: RowSplit | None = None, kernels: EagerKernels | None = None
    ) -> torch.Tensor:
        if self.quant_gate_up is not None:
            gate_up = self.quant_gate_up.forward(x, rows)
        else:
            gate_up = prepacked_linear.linear(x, self.gate_up_weight, None, self.packed_gate_up)
        if kernels is not None:
            h = kernels.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            h = F.silu(gate).mul_(up)
        if self.quant_down is not None:
            return self.quant_down.forward(h, rows)
        return prepacked_linear.linear(h, self.down_proj.weight, None, self.packed_down)


def _norm(norm: RMSNorm, x: torch.Tensor, kernels: EagerKernels | None) -> torch.Tensor:
    return norm.forward(x) if kernels is None else kernels.rms_norm(x, norm.weight, norm.eps)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaBackbone(nn.Module):
    """Named `model` inside `LlamaForCausalLM`, as in HF."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        initialize: bool = True,
    ):
        """`initialize=False` allocates the parameters without computing torch's random init
        (about 3 s for a 135M-parameter model on 2 cores), for loaders that overwrite every one."""
        super().__init__()
        self.config = config
        with contextlib.nullcontext() if initialize else torch.device("meta"):
            self.model = self._backbone(config)
            if not config.tie_word_embeddings:
                self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if initialize:
            self.to(device=device, dtype=dtype)
        else:
            self.to(dtype=dtype).to_empty(device=device)
        self.rope = RotaryEmbedding(config, torch.device(device), dtype)
        self.requires_grad_(False)
        for layer in self.model.layers:
            layer.self_attn.fuse(copy_values=initialize)
            layer.mlp.fuse(copy_values=initialize)
        self.packed_lm_head: torch.Tensor | None = None
        self.quant_lm_head: QuantizedLinear | None = None

    def _backbone(self, config: ModelConfig) -> nn.Module:
        """The `model` module (embeddings, layers, final norm); architectures built on this one
        (gemma3.py) return theirs."""
        return LlamaBackbone(config)

    def _quantized_linears(self) -> list[QuantizedLinear]:
        return [m for m in self.modules() if isinstance(m, QuantizedLinear)]

    @property
    def weights_format(self) -> str:
        """ "mixed", "quantized" or "dense" (see weights/weights_summary.py)."""
        return weights_summary.weights_format(self._quantized_linears(), self.quant_lm_head)

    @property
    def quantized_kernel(self) -> str:
        """The kernel the quantized weights are multiplied by ("vnni", "avx2" or "torch"), "" for none."""
        quantized = self._quantized_linears()
        return quantized[0].kernel if quantized else ""

    @property
    def dense_copy_nbytes(self) -> int:
        """Bytes the 4-bit projections' dense copies take (not in the state dict)."""
        return sum(m.dense_nbytes for m in self._quantized_linears())

    def describe_weights(self) -> str:
        """The weights format, memory and kernel, for the start-up line (see weights/weights_summary.py)."""
        return weights_summary.describe(self._quantized_linears(), self.quant_lm_head)

    def use_quantized_lm_head(self, lm_head: QuantizedLinear | None) -> bool:
        """Serve the lm_head from quantized weights: an untied one's dense weight is dropped; a
        tied one is the embedding, whose input lookups then read the same blocks where they are
        Q8_0 for minipd's int8 kernels (weights/block_embedding.py; its dense table is dropped), else its
        dense table stays for them. Returns whether the embedding table was dropped."""
        if lm_head is None:
            return False
        self.quant_lm_head = lm_head
        if not self.config.tie_word_embeddings:
            del self.lm_head
            return False
        if lm_head.formats != (FORMATS["q8"],) or lm_head.kernel == "torch":
            return False
        self.model.embed_tokens = BlockEmbedding(lm_head, self.model.norm.weight.dtype)
        return True

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """float32 logits of the final-normed hidden states x [T, hidden]."""
        if self.quant_lm_head is not None:
            return self.quant_lm_head(x).float()
        return prepacked_linear.linear(x, self.lm_head_weight, None, self.packed_lm_head).float()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def prepack(self) -> bool:
        """Pack every linear weight for the CPU's bf16 matmuls (see weights/prepacked_linear.py); call
        it once the weights are loaded, and again whenever they change. Returns whether any
        weight was packed (False for other dtypes and devices, which need nothing)."""
        for layer in self.model.layers:
            layer.self_attn.prepack()
            layer.mlp.prepack()
        if self.quant_lm_head is None:
            self.packed_lm_head = prepacked_linear.prepack(self.lm_head_weight)
        return self.packed_lm_head is not None

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_pool: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
        buffers: GatherBuffers,
        layer_hook: LayerHook | None = None,
        rows: RowSplit | None = None,
        kernels: EagerKernels | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T]; kv_pool: [layers, blocks, 2, block_size, kv_heads, head_dim];
        `rows`: which rows the 4-bit projections' dense copies multiply (None: none). The
        logits rows always read the LM head's own weights (few rows: the 4-bit kernel's best).
        `kernels`: minipd's float32 kernels for the norms, SiLU and prefill attention
        (kernel_steps/prefill_kernels.py; None: torch's ops and SDPA).

        Returns logits [len(logits_indices), vocab] in float32.
        """
        x = self.model.embed_tokens(input_ids)
        cos, signed_sin = self.rope(positions)
        # Sub-modules are called through `.forward` on this path: nn.Module.__call__'s hook
        # handling costs a few µs a call, ~200 calls a decode step, and none has hooks.
        prefill_attention = None if kernels is None else kernels.attention
        for i, layer in enumerate(self.model.layers):
            residual = x
            h = _norm(layer.input_layernorm, x, kernels)
            attn = layer.self_attn
            q, k, v = attn.qkv(h, cos, signed_sin, rows)
            write_kv(kv_pool[i], k, v, meta)
            if layer_hook is not None:
                layer_hook(i)
            o = paged_attention(q, kv_pool[i], meta, buffers, attn.scale, prefill_attention)
            x = residual + attn.output(o.flatten(1), rows)
            x = x + layer.mlp.forward(_norm(layer.post_attention_layernorm, x, kernels), rows, kernels)
        return self.logits(_norm(self.model.norm, x[logits_indices], kernels))

    @torch.inference_mode()
    def forward_reference(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [T, vocab] (float32) of one sequence with full causal attention, no cache."""
        positions = torch.arange(input_ids.shape[0], device=input_ids.device)
        x = self.model.embed_tokens(input_ids)
        cos, signed_sin = self.rope(positions)
        for layer in self.model.layers:
            attn = layer.self_attn
            q, k, v = attn.qkv(layer.input_layernorm(x), cos, signed_sin)
            x = x + attn.output(causal_attention(q, k, v, attn.scale).flatten(1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.logits(self.model.norm(x))


def init_random_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Deterministic random weights (generated on the CPU, so every device gets the same)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                values = torch.ones(param.shape)
            elif name.endswith(".bias"):
                values = torch.randn(param.shape, generator=gen) * 0.02
            else:
                # Linear weights at twice the fan-in scale keep the random model from collapsing
                # into repeating one token, so greedy outputs make a discriminating test oracle.
                gain = 1.0 if name.endswith("embed_tokens.weight") else RANDOM_LINEAR_GAIN
                values = torch.randn(param.shape, generator=gen) * gain * param.shape[-1] ** -0.5
            param.copy_(values.to(param.dtype))
