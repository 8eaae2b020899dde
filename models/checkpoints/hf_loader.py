"""Load a Hugging Face Llama or Qwen2 checkpoint (config.json + safetensors) into minipd.

`config_from_hf` maps a parsed `config.json` onto `ModelConfig`, accepting both the
transformers 4.x layout (`rope_theta` and `rope_scaling` at the top level) and the 5.x one
(`rope_parameters`). Anything the model cannot reproduce exactly (another architecture, an
MLP bias, sliding-window attention, an unknown RoPE type, ...) is refused with a
`ValueError` that names the field, never silently approximated.

`load_hf_model` reads the weights with `safetensors` only (never pickle), checks the tensor
names and shapes against the model before copying anything, and returns the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from minipd.models.arch.llama import LlamaForCausalLM
from minipd.models.arch.model_config import ModelConfig, RopeScaling
from minipd.models.arch.rope import SUPPORTED_ROPE_TYPES

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_ARCHITECTURE_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# HF's own defaults when config.json leaves these out (LlamaConfig / Qwen2Config).
_DEFAULT_ROPE_THETA = 10000.0
_DEFAULT_RMS_NORM_EPS = 1e-6
_DEFAULT_MAX_POSITION_EMBEDDINGS = 2048
_SUPPORTED_HIDDEN_ACT = "silu"

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"

# Older checkpoints saved RoPE tables as persistent buffers; minipd recomputes them.
_IGNORED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
_TIED_HEAD = "lm_head.weight"
_EMBEDDING = "model.embed_tokens.weight"


def _architecture(hf: dict[str, Any]) -> str:
    architectures = hf.get("architectures") or []
    if architectures:
        for name in architectures:
            if name in SUPPORTED_ARCHITECTURES:
                return name
        raise ValueError(
            f"hf config: architecture {architectures} is not supported; supported: {list(SUPPORTED_ARCHITECTURES)}"
        )
    model_type = hf.get("model_type")
    if model_type in _ARCHITECTURE_BY_MODEL_TYPE:
        return _ARCHITECTURE_BY_MODEL_TYPE[model_type]
    raise ValueError(
        f"hf config: model_type {model_type!r} (no 'architectures') is not supported; "
        f"supported model types: {sorted(_ARCHITECTURE_BY_MODEL_TYPE)}"
    )


def _required(hf: dict[str, Any], field: str) -> Any:
    value = hf.get(field)
    if value is None:
        raise ValueError(f"hf config: required field {field!r} is missing")
    return value


def _rope_parameters(hf: dict[str, Any]) -> dict[str, Any]:
    """Merge the 4.x (`rope_scaling`) and 5.x (`rope_parameters`) layouts into one dict."""
    merged: dict[str, Any] = {}
    for field in ("rope_scaling", "rope_parameters"):
        params = hf.get(field)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise ValueError(f"hf config: {field} must be an object, got {params!r}")
        if any(isinstance(value, dict) for value in params.values()):
            raise ValueError(f"hf config: per-layer-type {field} is not supported")
        merged.update(params)
    if "rope_type" not in merged and "type" in merged:
        merged["rope_type"] = merged["type"]
    return merged


def _rope_scaling(
    params: dict[str, Any], max_position_embeddings: int, top_level_original_max: int | None
) -> RopeScaling | None:
    rope_type = params.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"hf config: rope type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("hf config: rope partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return None
    # HF lets a top-level original_max_position_embeddings override the rope dict's one.
    original_max = top_level_original_max or params.get("original_max_position_embeddings") or max_position_embeddings
    factor = params.get("factor")
    if factor is None and rope_type == "yarn":
        factor = max_position_embeddings / original_max  # HF's rule when yarn omits the factor
    if factor is None:
        raise ValueError(f"hf config: rope field 'factor' is required for rope type {rope_type!r}")
    if rope_type == "yarn" and params.get("truncate", True) is not True:
        raise ValueError("hf config: yarn with truncate=false is not supported")
    if rope_type == "llama3":
        for field in ("low_freq_factor", "high_freq_factor"):
            if params.get(field) is None:
                raise ValueError(f"hf config: rope field {field!r} is required for rope type 'llama3'")
    defaults = RopeScaling()
    return RopeScaling(
        rope_type=rope_type,
        factor=float(factor),
        low_freq_factor=float(params.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(params.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(original_max),
        # HF treats 0/None betas as unset (`or 32`), so do the same.
        beta_fast=float(params.get("beta_fast") or defaults.beta_fast),
        beta_slow=float(params.get("beta_slow") or defaults.beta_slow),
        attention_factor=params.get("attention_factor"),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
    )


def _eos_token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Map a parsed HF `config.json` (Llama or Qwen2) onto `ModelConfig`.

    Raises ValueError naming the architecture when it is not supported, and naming the
    field when a required one is missing or a feature cannot be reproduced exactly.
    """
    architecture = _architecture(hf)
    hidden_act = hf.get("hidden_act", _SUPPORTED_HIDDEN_ACT)
    if hidden_act != _SUPPORTED_HIDDEN_ACT:
        raise ValueError(f"hf config: hidden_act {hidden_act!r} is not supported (only {_SUPPORTED_HIDDEN_ACT!r})")
    if architecture == "Qwen2ForCausalLM":
        if hf.get("use_sliding_window"):
            raise ValueError("hf config: use_sliding_window=true is not supported (Qwen2 sliding-window attention)")
        attention_bias = True  # Qwen2 always has q/k/v biases, whatever the config says
    else:
        if hf.get("mlp_bias"):
            raise ValueError("hf config: mlp_bias=true is not supported (Llama MLP biases)")
        # Llama's attention_bias also puts a bias on o_proj, which ModelConfig cannot express
        # (its attention_bias is Qwen2's q/k/v-only one).
        if hf.get("attention_bias"):
            raise ValueError("hf config: attention_bias=true is not supported for LlamaForCausalLM (o_proj bias)")
        attention_bias = False

    hidden_size = int(_required(hf, "hidden_size"))
    num_heads = int(_required(hf, "num_attention_heads"))
    if hidden_size % num_heads and hf.get("head_dim") is None:
        raise ValueError(
            f"hf config: hidden_size ({hidden_size}) is not a multiple of num_attention_heads "
            f"({num_heads}) and 'head_dim' is missing"
        )
    max_position_embeddings = int(hf.get("max_position_embeddings") or _DEFAULT_MAX_POSITION_EMBEDDINGS)
    rope = _rope_parameters(hf)
    rope_theta = rope.get("rope_theta", hf.get("rope_theta", _DEFAULT_ROPE_THETA))
    return ModelConfig(
        vocab_size=int(_required(hf, "vocab_size")),
        hidden_size=hidden_size,
        intermediate_size=int(_required(hf, "intermediate_size")),
        num_layers=int(_required(hf, "num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hidden_size // num_heads),
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=float(hf.get("rms_norm_eps", _DEFAULT_RMS_NORM_EPS)),
        rope_theta=float(rope_theta),
        rope_scaling=_rope_scaling(rope, max_position_embeddings, hf.get("original_max_position_embeddings")),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_eos_token_ids(hf.get("eos_token_id")),
        architecture=architecture,
    )


def _weight_files(path: Path) -> list[Path]:
    index = path / WEIGHTS_INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [path / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(f"hf checkpoint: shard {file} listed in {index} does not exist")
        return files
    if (path / SINGLE_WEIGHTS_FILE).is_file():
        return [path / SINGLE_WEIGHTS_FILE]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"hf checkpoint: no {SINGLE_WEIGHTS_FILE}, {WEIGHTS_INDEX_FILE} or *.safetensors file in {path}"
        )
    return files


def _tensor_locations(files: list[Path]) -> dict[str, Path]:
    """Map every tensor name to the file holding it (reads only the safetensors headers)."""
    locations: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name in locations:
                    raise ValueError(f"hf checkpoint: tensor {name!r} is in both {locations[name]} and {file}")
                locations[name] = file
    return {name: file for name, file in locations.items() if not name.endswith(_IGNORED_TENSOR_SUFFIXES)}


def _read_tensor(file: Path, name: str) -> torch.Tensor:
    with safe_open(str(file), framework="pt") as f:
        return f.get_tensor(name)


def _drop_tied_head(locations: dict[str, Path]) -> None:
    """A tied model may still ship lm_head.weight; accept it only if it is the embedding."""
    if _TIED_HEAD not in locations or _EMBEDDING not in locations:
        return
    head, embedding = _read_tensor(locations[_TIED_HEAD], _TIED_HEAD), _read_tensor(locations[_EMBEDDING], _EMBEDDING)
    if head.shape != embedding.shape or not torch.equal(head, embedding):
        raise ValueError(
            "hf checkpoint: tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight"
        )
    del locations[_TIED_HEAD]


def load_hf_model(
    path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> LlamaForCausalLM:
    """Build a `LlamaForCausalLM` from a HF checkpoint directory.

    Reads `config.json` and the weights from `model.safetensors.index.json` + its shards,
    else `model.safetensors`, else every `*.safetensors` in the directory. Tensors are cast
    to `dtype` and placed on `device`. Raises FileNotFoundError naming the missing
    directory/file, and ValueError listing missing or unexpected tensors or a shape mismatch
    (checked before any weight is copied).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"hf checkpoint: directory {path} does not exist")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"hf checkpoint: {config_file} does not exist")
    config = config_from_hf(json.loads(config_file.read_text()))
    locations = _tensor_locations(_weight_files(path))
    if config.tie_word_embeddings:
        _drop_tied_head(locations)

    model = LlamaForCausalLM(config, device=device, dtype=dtype, initialize=False)  # all overwritten below
    params = model.state_dict()
    missing = sorted(set(params) - set(locations))
    unexpected = sorted(set(locations) - set(params))
    if missing or unexpected:
        raise ValueError(f"hf checkpoint {path}: missing tensors {missing}; unexpected tensors {unexpected}")
    names_by_file: dict[Path, list[str]] = {}
    for name, file in locations.items():
        names_by_file.setdefault(file, []).append(name)
    for file, names in names_by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for name in names:
                shape = tuple(f.get_slice(name).get_shape())
                if shape != tuple(params[name].shape):
                    raise ValueError(
                        f"hf checkpoint: tensor {name!r} in {file} has shape {shape}, "
                        f"expected {tuple(params[name].shape)}"
                    )
    with torch.no_grad():
        for file, names in names_by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    params[name].copy_(f.get_tensor(name).to(dtype))
    return model
