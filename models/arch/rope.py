"""Rotary position embeddings with the usual scaling options (HF `rope_scaling`).

`RotaryEmbedding` precomputes cos/sin tables for every position up to
`max_position_embeddings` once; applying it is an index, a roll and two multiply-adds.
The inverse-frequency formulas follow Hugging Face's `modeling_rope_utils` so that
checkpoints behave the same here and there.
"""

from __future__ import annotations

import math

import torch

from minipd.models.arch.model_config import ModelConfig, RopeScaling

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _default_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling, max_pos: int) -> torch.Tensor:
    old_context_len = s.original_max_position_embeddings or max_pos
    low_freq_wavelen = old_context_len / s.low_freq_factor
    high_freq_wavelen = old_context_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_context_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, base: float, s: RopeScaling, max_pos: int) -> tuple[torch.Tensor, float]:
    original_max = s.original_max_position_embeddings or max_pos
    if s.attention_factor is not None:
        attention_factor = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        attention_factor = _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
    else:
        attention_factor = _yarn_mscale(s.factor)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation_weight = 1 - ramp
    inv_freq = (1 / (s.factor * pos_freqs)) * (1 - extrapolation_weight) + (1 / pos_freqs) * extrapolation_weight
    return inv_freq, attention_factor


def rope_inv_freq(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Return (inverse frequencies [head_dim/2] in float64, attention scaling of cos/sin)."""
    dim, base, s = config.head_dim, config.rope_theta, config.rope_scaling
    rope_type = "default" if s is None else s.rope_type
    if rope_type == "default":
        return _default_inv_freq(dim, base), 1.0
    if rope_type == "linear":
        return _default_inv_freq(dim, base) / s.factor, 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(_default_inv_freq(dim, base), s, config.max_position_embeddings), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(dim, base, s, config.max_position_embeddings)
    raise ValueError(f"rope_scaling.rope_type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")


class RotaryEmbedding(torch.nn.Module):
    """cos/sin tables for RoPE (rotate-half convention, as Llama and Qwen2 use)."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype):
        super().__init__()
        inv_freq, attention_factor = rope_inv_freq(config)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float64)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        # Computed in float32 like HF, then cast, so low-precision dtypes round the same way.
        self.register_buffer(
            "cos", (emb.float().cos() * attention_factor).to(device=device, dtype=dtype), persistent=False
        )
        sin = (emb.float().sin() * attention_factor).to(device=device, dtype=dtype)
        self.register_buffer("sin", sin, persistent=False)
        # sin with its first half negated: rotate_half(x) * sin == x.roll(half) * signed_sin
        # bit for bit (negating is exact on either factor), in one op where rotate_half takes four.
        half = sin.shape[-1] // 2
        self.register_buffer("signed_sin", torch.cat((-sin[:, :half], sin[:, half:]), dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (see `apply_rope`) for `positions` ([T]), shaped [T, 1, head_dim] to
        broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.signed_sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x ([T, heads, head_dim]) by the angles whose cos and signed sin come from
    `RotaryEmbedding`: HF's x * cos + rotate_half(x) * sin, with rotate_half(x) =
    cat(-x2, x1) written as roll(x) times the sign folded into the table."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin
