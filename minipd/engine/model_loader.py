"""Resolve `--model`: a built-in preset name or a Hugging Face-format directory."""

from __future__ import annotations

import os

import torch

from minipd.models.config import PRESET_SEED, PRESETS, preset_config
from minipd.models.llama import LlamaForCausalLM, init_random_weights
from minipd.models.tokenizer import ByteTokenizer, Tokenizer


def load_model(name_or_path: str, device: torch.device, dtype: torch.dtype) -> tuple[LlamaForCausalLM, Tokenizer]:
    """Return (model, tokenizer). Presets get seeded random weights and the byte tokenizer."""
    if name_or_path in PRESETS:
        model = LlamaForCausalLM(preset_config(name_or_path), device=device, dtype=dtype)
        init_random_weights(model, PRESET_SEED)
        return model.eval(), ByteTokenizer()
    if os.path.isdir(name_or_path):
        from minipd.models.hf_loader import load_hf_model
        from minipd.models.tokenizer import load_tokenizer

        return load_hf_model(name_or_path, device=device, dtype=dtype).eval(), load_tokenizer(name_or_path)
    raise ValueError(f"model: {name_or_path!r} is neither a preset ({sorted(PRESETS)}) nor a directory")


def load_tokenizer_only(name_or_path: str) -> Tokenizer:
    """The tokenizer of a preset or HF directory, without loading weights (for the router)."""
    if name_or_path in PRESETS:
        return ByteTokenizer()
    if os.path.isdir(name_or_path):
        from minipd.models.tokenizer import load_tokenizer

        return load_tokenizer(name_or_path)
    raise ValueError(f"model: {name_or_path!r} is neither a preset ({sorted(PRESETS)}) nor a directory")
