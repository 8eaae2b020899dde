"""What a gemma3 GGUF says beyond the metadata llama and qwen2 share (see gguf_loader.py).

As llama.cpp reads a gemma3 file (llama-model.cpp, LLM_ARCH_GEMMA3) and its converter writes one
(convert_hf_to_gguf.py, Gemma3Model):
- `gemma3.attention.sliding_window`: the sliding layers' window; every 6th layer attends
  globally (llama.cpp fixes the pattern at 6; an integer `gemma3.attention.sliding_window_pattern`
  overrides it, a per-layer list is refused);
- the sliding layers' RoPE base is 10000 (llama.cpp's fixed value; `gemma3.rope.freq_base_swa`
  overrides it), the global ones' `gemma3.rope.freq_base`;
- queries are scaled by key_length ** -0.5, except in the 62-layer (27B) model, by
  (embedding_length / head_count) ** -0.5;
- `gemma3.final_logit_softcapping`, when present, caps the logits;
- every `*norm.weight` is stored as HF's weight plus 1 (Gemma's RMSNorm multiplies by 1 + weight):
  `NORM_SHIFT` is taken off on loading;
- Q/K rows are stored as HF has them (llama.cpp rotates Gemma the NEOX way).
"""

from __future__ import annotations

from typing import Any

ARCH = "gemma3"
NORM_SHIFT = 1.0
DEFAULT_PATTERN = 6
DEFAULT_LOCAL_ROPE_BASE = 10000.0
_LAYERS_27B = 62

# Gemma 3's norms (blk.N.<gguf> -> model.layers.N.<param>); its projections are named as llama's.
NORM_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}


def config_fields(metadata: dict[str, Any], hidden_size: int, num_heads: int, head_dim: int) -> dict[str, Any]:
    """The `ModelConfig` fields only Gemma 3 has, from a gemma3 file's metadata."""
    window = metadata.get(f"{ARCH}.attention.sliding_window")
    pattern = metadata.get(f"{ARCH}.attention.sliding_window_pattern", DEFAULT_PATTERN)
    if isinstance(pattern, list):
        raise ValueError(f"gguf: {ARCH}.attention.sliding_window_pattern as a per-layer list is not supported")
    if metadata.get(f"{ARCH}.attn_logit_softcapping") is not None:
        raise ValueError(f"gguf: {ARCH}.attn_logit_softcapping (attention logit soft-capping) is not supported")
    num_layers = int(metadata.get(f"{ARCH}.block_count") or 0)
    scalar = hidden_size // num_heads if num_layers == _LAYERS_27B else head_dim
    cap = metadata.get(f"{ARCH}.final_logit_softcapping")
    return dict(
        sliding_window=None if window is None else int(window),
        sliding_window_pattern=int(pattern),
        rope_local_theta=float(metadata.get(f"{ARCH}.rope.freq_base_swa", DEFAULT_LOCAL_ROPE_BASE)),
        query_pre_attn_scalar=float(scalar),
        final_logit_softcapping=None if cap is None else float(cap),
    )
