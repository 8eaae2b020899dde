"""The fused decode step (`kernels/fused_decode.cpp`): a whole decode step of a model whose projections
and lm_head all sit in GGUF's blocks, in one op call instead of ~30 eager torch ops a layer.

`FusedDecode.of(model)` prepares a model's arguments once (the packed weights in the op's
order, float32 copies of the norms and rotary tables, its shapes), or says why it cannot be
used (`unsupported`): the model must be on the CPU in float32 or bfloat16, every projection and
the lm_head served by one of minipd's int8 kernels ("vnni", "avx2"), in any of their block
formats (Q4_0/Q4_1, Q8_0, Q5_0 as Q8, Q4_K, Q6_K; a weight may mix them by segment); q/k/v
biases (qwen2) are added in float32.
Calling it runs decode rows, one new token per sequence at its position, in float32 whatever
the model's dtype, writing their K/V into the pool (in its dtype) and returning float32 logits.

What the step computes is stated in the .cpp's header; a row's logits depend on that row only,
and they are close to, not bit-equal to, the eager path's (the engine uses one of the two for
every decode row: model_runner.py). Prefill chunks always run eagerly.
"""

from __future__ import annotations

import torch

from minipd.models.arch.llama import LlamaForCausalLM
from minipd.models.kernels import vnni_kernels
from minipd.models.weights.quantized_linear import INT8_KERNELS, QuantizedLinear


def unsupported(model: LlamaForCausalLM) -> str | None:
    """Why the fused step cannot run `model`, or None."""
    if model.config.sliding_window is not None:
        return "sliding-window attention (Gemma 3) runs through torch's ops only"
    norm = model.model.norm.weight
    if norm.device.type != "cpu" or norm.dtype not in (torch.float32, torch.bfloat16):
        return (
            f"the fused decode step runs float32 or bfloat16 models on the CPU, not {norm.dtype} on {norm.device.type}"
        )
    linears: list[QuantizedLinear | None] = [model.quant_lm_head]
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [attn.quant_qkv, attn.quant_o, mlp.quant_gate_up, mlp.quant_down]
    kernels = {m.kernel if m is not None else None for m in linears}
    if None in kernels or len(kernels) != 1 or not kernels <= set(INT8_KERNELS):
        return "the fused decode step needs every projection and the lm_head in blocks, multiplied by one int8 kernel"
    return None


class FusedDecode:
    """A model's arguments for `decode_step`, gathered once (they are views of its weights)."""

    def __init__(self, model: LlamaForCausalLM):
        if (why := unsupported(model)) is not None:
            raise ValueError(why)
        config, layers = model.config, model.model.layers
        self.kernel = model.quant_lm_head.kernel
        vnni_kernels.load(self.kernel)
        self._op = getattr(torch.ops, f"minipd_{self.kernel}").decode_step  # looked up once, not every step
        norms = [w for layer in layers for w in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)]
        self.norms = [w.float().contiguous() for w in (*norms, model.model.norm.weight)]
        linears = [
            m
            for layer in layers
            for m in (layer.self_attn.quant_qkv, layer.self_attn.quant_o, layer.mlp.quant_gate_up, layer.mlp.quant_down)
        ]
        linears.append(model.quant_lm_head)
        self.packed = [m.packed for m in linears]
        self.formats = [f for m in linears for f in m.formats]  # each weight's segments, flattened
        self.outs = [o for m in linears for o in m.outs]
        self.segments = [len(m.formats) for m in linears]
        empty = torch.empty(0)
        self.biases = [
            empty if layer.self_attn.qkv_bias is None else layer.self_attn.qkv_bias.float().contiguous()
            for layer in layers
        ]
        self.embed = model.model.embed_tokens  # nn.Embedding, or block_embedding.BlockEmbedding
        self.cos, self.signed_sin = model.rope.cos.float().contiguous(), model.rope.signed_sin.float().contiguous()
        self.heads, self.kv_heads = config.num_heads, config.num_kv_heads
        self.intermediate, self.eps = config.intermediate_size, config.rms_norm_eps
        self.scale = layers[0].self_attn.scale

    @classmethod
    def of(cls, model: LlamaForCausalLM) -> FusedDecode | None:
        """The prepared step, or None where `unsupported(model)`."""
        return None if unsupported(model) is not None else cls(model)

    @torch.inference_mode()
    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor, kv_pool: torch.Tensor
    ) -> torch.Tensor:
        """Logits [rows, vocab] (float32) of each row's token `input_ids[r]` at `positions[r]`,
        its sequence's blocks in `block_tables[r]` (int64 [rows, max_blocks], padded with any
        id past the position's block); writes each row's K/V into `kv_pool`."""
        return self._op(
            self.embed(input_ids).float(),
            positions,
            block_tables,
            kv_pool,
            self.cos,
            self.signed_sin,
            self.norms,
            self.packed,
            self.formats,
            self.outs,
            self.segments,
            self.biases,
            self.heads,
            self.kv_heads,
            self.intermediate,
            self.eps,
            self.scale,
        )
