"""Gemma 3 decoder (text only) with paged attention, on top of the Llama one (llama.py).

Module and parameter names equal Hugging Face's `Gemma3ForCausalLM`, and so does the math:
- embeddings scaled by sqrt(hidden_size) (in the model's dtype, as HF rounds it);
- RMSNorm by (1 + weight), normalised in float32 (`GemmaRMSNorm`; the weight is HF's, without
  the 1 llama.cpp's converter adds: the GGUF loader takes it off);
- four norms a layer: before and after attention (`input_layernorm`, `post_attention_layernorm`),
  before and after the MLP (`pre_feedforward_layernorm`, `post_feedforward_layernorm`), each
  after-norm applied to the branch before it joins the residual;
- q and k normed per head (`q_norm`, `k_norm`) before RoPE;
- sliding-window layers (`ModelConfig.is_sliding`) rotate by the local RoPE base and see the last
  `sliding_window` keys (`AttentionMetadata.sliding`); the global ones rotate by `rope_theta`
  (with its scaling) and see every key;
- attention scaled by query_pre_attn_scalar ** -0.5; a GELU (tanh) gated MLP;
- logits soft-capped (tanh) when `final_logit_softcapping` is set.

Served with dense weights only, through torch's ops: the 4-bit kernels, minipd's prefill kernels
and the fused decode step are the Llama family's (`forward` ignores its `rows` and `kernels`).
"""

from __future__ import annotations

import msgspec
import torch
import torch.nn.functional as F
from torch import nn

from minipd.models.arch.llama import MLP, Attention, LayerHook, LlamaForCausalLM
from minipd.models.arch.model_config import ModelConfig
from minipd.models.arch.paged_attention import (
    AttentionMetadata,
    GatherBuffers,
    causal_attention,
    paged_attention,
    write_kv,
)
from minipd.models.arch.rope import RotaryEmbedding, apply_rope
from minipd.models.weights import prepacked_linear
from minipd.models.weights.row_split import RowSplit

ARCHITECTURE = "Gemma3ForCausalLM"


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), in float32, cast back to x's dtype (HF's Gemma3RMSNorm)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Attention(Attention):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, rows: RowSplit | None = None):
        """Projected q [T, heads, d], normed and rotated q and k, and v [T, kv_heads, d]."""
        t, heads, kv_heads, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = prepacked_linear.linear(x, self.qkv_weight, self.qkv_bias, self.packed_qkv).view(
            t, heads + 2 * kv_heads, d
        )
        q = apply_rope(self.q_norm.forward(qkv[:, :heads]), cos, signed_sin)
        k = apply_rope(self.k_norm.forward(qkv[:, heads : heads + kv_heads]), cos, signed_sin)
        return q, k, qkv[:, heads + kv_heads :]


class GeluMLP(MLP):
    """down(gelu_tanh(gate) * up)."""

    def forward(self, x: torch.Tensor, rows: RowSplit | None = None, kernels=None) -> torch.Tensor:
        gate, up = prepacked_linear.linear(x, self.gate_up_weight, None, self.packed_gate_up).chunk(2, dim=-1)
        h = F.gelu(gate, approximate="tanh").mul_(up)
        return prepacked_linear.linear(h, self.down_proj.weight, None, self.packed_down)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Gemma3Attention(config)
        self.mlp = GeluMLP(config)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)


class Gemma3Backbone(nn.Module):
    """Named `model` inside `Gemma3ForCausalLM`, as in HF."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """The Llama model's weights handling (fusing, prepacking, tied lm_head) around Gemma 3's layers."""

    def __init__(
        self,
        config: ModelConfig,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        initialize: bool = True,
    ):
        super().__init__(config, device, dtype, initialize)
        local = msgspec.structs.replace(
            config, rope_theta=config.rope_local_theta or config.rope_theta, rope_scaling=None
        )
        self.local_rope = RotaryEmbedding(local, torch.device(device), dtype)

    def _backbone(self, config: ModelConfig) -> nn.Module:
        return Gemma3Backbone(config)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        return x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)

    def _final_logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.logits(self.model.norm.forward(x))
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _ropes(self, positions: torch.Tensor):
        return self.rope(positions), self.local_rope(positions)

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
        kernels=None,
    ) -> torch.Tensor:
        """As `LlamaForCausalLM.forward` (`rows` and `kernels` unused); the sliding layers
        attend through `meta.sliding`, which a model with a sliding window needs."""
        x = self._embed(input_ids)
        global_rope, local_rope = self._ropes(positions)
        for i, layer in enumerate(self.model.layers):
            sliding = self.config.is_sliding(i)
            attn = layer.self_attn
            q, k, v = attn.qkv(layer.input_layernorm.forward(x), *(local_rope if sliding else global_rope))
            write_kv(kv_pool[i], k, v, meta)
            if layer_hook is not None:
                layer_hook(i)
            o = paged_attention(q, kv_pool[i], meta.sliding if sliding else meta, buffers, attn.scale)
            x = x + layer.post_attention_layernorm.forward(attn.output(o.flatten(1)))
            h = layer.mlp.forward(layer.pre_feedforward_layernorm.forward(x))
            x = x + layer.post_feedforward_layernorm.forward(h)
        return self._final_logits(x[logits_indices])

    @torch.inference_mode()
    def forward_reference(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [T, vocab] (float32) of one sequence with causal (sliding where a layer slides)
        attention, no cache."""
        positions = torch.arange(input_ids.shape[0], device=input_ids.device)
        x = self._embed(input_ids)
        global_rope, local_rope = self._ropes(positions)
        for i, layer in enumerate(self.model.layers):
            sliding = self.config.is_sliding(i)
            attn = layer.self_attn
            q, k, v = attn.qkv(layer.input_layernorm(x), *(local_rope if sliding else global_rope))
            window = self.config.sliding_window if sliding else None
            o = causal_attention(q, k, v, attn.scale, window)
            x = x + layer.post_attention_layernorm(attn.output(o.flatten(1)))
            x = x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
        return self._final_logits(x)
