"""Model configuration and the built-in presets.

`ModelConfig` is the single description of a Llama-family decoder that the model, the
KV pool, the HF loader and the compatibility fingerprint all read. It is a frozen msgspec
Struct so it can be hashed, compared and sent over the control plane as msgpack.
"""

from __future__ import annotations

import msgspec


class RopeScaling(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """RoPE scaling as Hugging Face writes it in config.json (`rope_scaling`).

    Supported `rope_type`s: "default", "linear", "llama3", "yarn".
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None


class ModelConfig(msgspec.Struct, frozen=True):
    """Architecture of a Llama-style decoder (Llama and Qwen2 families, and Gemma 3, whose extra
    fields below keep their defaults for the others).

    Gemma 3's fields: `sliding_window` keys a sliding layer's query sees, itself included (None:
    every layer attends to the whole context); every `sliding_window_pattern`-th layer (1-based)
    attends globally, the others slide (HF's `sliding_window_pattern`; 1: none slides);
    `rope_local_theta` the sliding layers' RoPE base (None: `rope_theta`); `query_pre_attn_scalar`
    the attention scale's inverse square (None: head_dim); `final_logit_softcapping` caps the
    logits at that magnitude with tanh (None: no cap).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "LlamaForCausalLM"
    sliding_window: int | None = None
    sliding_window_pattern: int = 1
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.sliding_window_pattern < 1:
            raise ValueError(f"sliding_window_pattern ({self.sliding_window_pattern}) must be at least 1")

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) attends to the last `sliding_window` keys only."""
        return self.sliding_window is not None and (layer + 1) % self.sliding_window_pattern != 0


# Byte-level tokenizer ids used by the presets: 0..255 are bytes.
BYTE_BOS_ID = 256
BYTE_EOS_ID = 257
BYTE_VOCAB_SIZE = 260  # 256 bytes + BOS + EOS + 2 spare ids, a multiple of 4

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=BYTE_BOS_ID,
        eos_token_ids=(BYTE_EOS_ID,),
    ),
    "small": ModelConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=512,
        intermediate_size=1536,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=BYTE_BOS_ID,
        eos_token_ids=(BYTE_EOS_ID,),
    ),
}

PRESET_SEED = 1234  # the presets' random weights are a pure function of this seed


def preset_config(name: str) -> ModelConfig:
    """Return the preset called `name`, or raise ValueError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"model: unknown preset {name!r}; known presets: {sorted(PRESETS)}") from None
