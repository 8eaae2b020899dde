"""Resolve `--model`: a built-in preset name, a packaged real model (`smollm2`), a `.gguf`
file, or a Hugging Face-format directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minipd.models.arch.llama import LlamaForCausalLM, init_random_weights
from minipd.models.arch.model_config import PRESET_SEED, PRESETS, preset_config
from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS, packaged_model_path
from minipd.models.tokenizers.tokenizer import ByteTokenizer, Tokenizer

if TYPE_CHECKING:
    from minipd.models.gguf.gguf_file import GGUFFile

GGUF_SUFFIX = ".gguf"


def gguf_path(name_or_path: str) -> Path | None:  # also the benchmarks' (the file's tensor bytes)
    """The GGUF file `name_or_path` names (a packaged model or a path ending in .gguf), else None."""
    if name_or_path in PACKAGED_MODELS:
        return packaged_model_path(name_or_path)
    if name_or_path.lower().endswith(GGUF_SUFFIX):
        path = Path(name_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"model: GGUF file {path} does not exist")
        return path
    return None


def _gguf_header(path: Path) -> tuple[GGUFFile, Tokenizer]:
    """The parsed file (no tensor read) and its tokenizer. An unsupported architecture is refused
    first, naming it (a gemma3 file's SentencePiece tokenizer would be refused too, but the
    architecture is what a user must hear about), then an unsupported tokenizer."""
    from minipd.models.gguf.gguf_file import read_gguf
    from minipd.models.gguf.gguf_loader import gguf_architecture
    from minipd.models.tokenizers.gguf_tokenizer import gguf_tokenizer

    file = read_gguf(path)
    gguf_architecture(file)
    return file, gguf_tokenizer(file)


def _unknown(name_or_path: str) -> ValueError:
    return ValueError(
        f"model: {name_or_path!r} is neither a preset ({sorted(PRESETS)}), a packaged model "
        f"({sorted(PACKAGED_MODELS)}), a {GGUF_SUFFIX} file nor a directory"
    )


def load_model(
    name_or_path: str, device: torch.device, dtype: torch.dtype, weights: str = "auto", quantized_kernel: str = "auto"
) -> tuple[LlamaForCausalLM, Tokenizer]:
    """Return (model, tokenizer), the weights packed for the device's matmuls where that helps
    (`LlamaForCausalLM.prepack`). Presets get seeded random weights and the byte tokenizer.
    A GGUF's Q4_0/Q4_1 projections are served as stored with `weights` "quantized"; "mixed"
    also keeps a dense copy of each for prefill chunks (decode still reads the 4-bit
    weights), and "auto" is "mixed" in bfloat16 and "quantized" in float32 wherever that can
    be (`gguf_loader.auto_weights`), else they are
    dequantized to `dtype` ("dense", which every other tensor and every other format is);
    `model.weights_format` says which. "quantized" or "mixed" where it cannot be is a
    ValueError saying why. `quantized_kernel` ("auto", "vnni", "avx2", "torch") multiplies the quantized
    weights (`quantized_linear.choose_kernel`); `model.quantized_kernel` says which."""
    model, tokenizer = _load(name_or_path, device, dtype, weights, quantized_kernel)
    model.prepack()
    return model, tokenizer


def _load(
    name_or_path: str, device: torch.device, dtype: torch.dtype, weights: str, quantized_kernel: str
) -> tuple[LlamaForCausalLM, Tokenizer]:
    gguf_file_path = None if name_or_path in PRESETS else gguf_path(name_or_path)
    if weights in ("quantized", "mixed") and gguf_file_path is None:
        raise ValueError(f"weights: {weights}: {name_or_path!r} is not a GGUF file with 4-bit tensors")
    if name_or_path in PRESETS:
        model = LlamaForCausalLM(preset_config(name_or_path), device=device, dtype=dtype)
        init_random_weights(model, PRESET_SEED)
        return model.eval(), ByteTokenizer()
    if gguf_file_path is not None:
        from minipd.models.gguf.gguf_loader import auto_weights, load_gguf_weights

        file, tokenizer = _gguf_header(gguf_file_path)
        if weights == "auto":
            weights = auto_weights(file, device, dtype, quantized_kernel)
        model = load_gguf_weights(file, device=device, dtype=dtype, weights=weights, quantized_kernel=quantized_kernel)
        return model.eval(), tokenizer
    if os.path.isdir(name_or_path):
        from minipd.models.checkpoints.hf_loader import load_hf_model
        from minipd.models.tokenizers.tokenizer import load_tokenizer

        return load_hf_model(name_or_path, device=device, dtype=dtype).eval(), load_tokenizer(name_or_path)
    raise _unknown(name_or_path)


def load_tokenizer_only(name_or_path: str) -> Tokenizer:
    """The tokenizer of `--model` without loading weights (for the router): a GGUF file's
    header is parsed, none of its tensors is read."""
    if name_or_path in PRESETS:
        return ByteTokenizer()
    gguf_file_path = gguf_path(name_or_path)
    if gguf_file_path is not None:
        return _gguf_header(gguf_file_path)[1]
    if os.path.isdir(name_or_path):
        from minipd.models.tokenizers.tokenizer import load_tokenizer

        return load_tokenizer(name_or_path)
    raise _unknown(name_or_path)
