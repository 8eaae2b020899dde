"""Load a llama-, qwen2- or gemma3-architecture GGUF file (llama.cpp's format) into minipd.

`config_from_gguf` maps the `<arch>.*` metadata onto `ModelConfig` (special token ids from
`tokenizer.ggml.*`). Anything the model cannot reproduce exactly -- another architecture,
mixture-of-experts, partial rotary, RoPE frequency factors, a RoPE scaling other than
linear -- is refused with a `ValueError` naming it. qwen2 is llama plus q/k/v biases
(`blk.N.attn_q.bias`, ...), with its Q/K rows stored as Hugging Face has them (llama.cpp rotates
qwen2 the NEOX way, halves apart, so its converter does not permute them). gemma3 is Gemma 3's
text decoder (arch/gemma3.py; its own metadata, tensor names and norms: gguf_gemma3.py), served
with dense weights only.

`load_gguf_model` checks every tensor's name, type and shape before it allocates the model,
then dequantizes one tensor at a time to float32 (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K, Q6_K: gguf_dequantize.py), undoes llama.cpp's Q/K row permutation (llama), and
copies it into the model in the engine dtype; each float32 copy is dropped before the next
tensor is read. With `weights="quantized"` the Q4_0/Q4_1 projections are instead kept in their
4-bit blocks and multiplied as stored (gguf_quantized.py); that needs the CPU, in bfloat16 (any
kernel) or float32 (minipd's int8 kernels). With minipd's kernels ("vnni", "avx2") Q8_0, Q5_0,
Q4_K and Q6_K projections are kept as stored too (kquant_segments.py). `weights="mixed"` keeps
them so and adds each one's dense copy in the model's dtype, for the rows of prefill chunks
(`QuantizedLinear.from_q4`, `from_segments`). Types no kernel reads (Q5_1, Q5_K; all but Q4_0/Q4_1
for torch's kernel) are dequantized to the model's dtype, and a log line names them
(dequantized_log.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch

from minipd.models.arch.gemma3 import Gemma3ForCausalLM
from minipd.models.arch.llama import LlamaForCausalLM
from minipd.models.arch.model_config import ModelConfig, RopeScaling
from minipd.models.gguf import gguf_gemma3
from minipd.models.gguf.dequantized_log import log_dequantized
from minipd.models.gguf.gguf_dequantize import DEQUANTIZED_TYPES, dequantize
from minipd.models.gguf.gguf_file import GGUFFile, GGUFTensorInfo, read_gguf
from minipd.models.gguf.gguf_quantized import Q4_TYPES, attach_quantized
from minipd.models.gguf.kquant_segments import SEGMENT_TYPES
from minipd.models.kernels import vnni_kernels
from minipd.models.weights.quantized_linear import INT8_KERNELS, choose_kernel, kernel_available

# blk.N.<gguf> -> model.layers.N.<param> for the projections every architecture names alike
_PROJECTION_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


class _Architecture(NamedTuple):
    hf_name: str  # ModelConfig.architecture
    attention_bias: bool  # q/k/v biases (blk.N.attn_q.bias, ...)
    permuted_qk: bool  # llama.cpp's converter interleaved each head's Q/K rows (rotary pairs)
    model: type[LlamaForCausalLM] = LlamaForCausalLM
    layer_names: dict[str, str] | None = None  # blk.N.<gguf> -> model.layers.N.<param> (None: _LAYER_NAMES)
    norm_shift: float = 0.0  # taken off every *norm.weight (the converter added it)
    quantizable: bool = True  # its 4-bit projections can be served as stored


ARCHITECTURES = {
    "llama": _Architecture("LlamaForCausalLM", attention_bias=False, permuted_qk=True),
    "qwen2": _Architecture("Qwen2ForCausalLM", attention_bias=True, permuted_qk=False),
    "gemma3": _Architecture(
        "Gemma3ForCausalLM",
        attention_bias=False,
        permuted_qk=False,
        model=Gemma3ForCausalLM,
        layer_names={**gguf_gemma3.NORM_NAMES, **_PROJECTION_NAMES},
        norm_shift=gguf_gemma3.NORM_SHIFT,
        quantizable=False,
    ),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
SUPPORTED_TENSOR_TYPES = DEQUANTIZED_TYPES
SUPPORTED_ROPE_SCALING = ("none", "linear")
# 4-bit tensors multiplied as stored; so, plus a dense copy for prefill rows; or dequantized to the dtype
WEIGHT_FORMATS = ("quantized", "mixed", "dense")
QUANTIZED_FORMATS = ("quantized", "mixed")

ARCHITECTURE_KEY = "general.architecture"
# llama.cpp's defaults (llama-hparams / llama-model.cpp) when a llama file leaves these out.
_DEFAULT_ROPE_THETA = 10000.0
_DEFAULT_RMS_NORM_EPS = 1e-5

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    **_PROJECTION_NAMES,
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
}
_LAYER_PREFIX = "blk."
_OUTPUT = "output.weight"
_ROPE_FACTORS = "rope_freqs.weight"


def _required(metadata: dict[str, Any], key: str) -> Any:
    value = metadata.get(key)
    if value is None:
        raise ValueError(f"gguf: required metadata {key!r} is missing")
    if isinstance(value, list):
        raise ValueError(f"gguf: metadata {key!r} is a per-layer list, which is not supported")
    return value


def gguf_architecture(file: GGUFFile) -> str:
    """`general.architecture`, or ValueError naming it when it is not supported."""
    architecture = file.metadata.get(ARCHITECTURE_KEY)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"gguf: architecture {architecture!r} ({ARCHITECTURE_KEY} in {file.path}) is not "
            f"supported; supported: {list(SUPPORTED_ARCHITECTURES)}"
        )
    return architecture


def _rope_scaling(metadata: dict[str, Any], arch: str) -> RopeScaling | None:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind not in SUPPORTED_ROPE_SCALING:
        raise ValueError(
            f"gguf: {arch}.rope.scaling.type {kind!r} is not supported; supported: {list(SUPPORTED_ROPE_SCALING)}"
        )
    factor = float(metadata.get(f"{arch}.rope.scaling.factor", 1.0))
    if kind == "none" or factor == 1.0:
        return None
    return RopeScaling(rope_type="linear", factor=factor)


def _eos_token_ids(metadata: dict[str, Any]) -> tuple[int, ...]:
    """EOS plus llama.cpp's other end-of-generation ids (end of turn, end of message)."""
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    return tuple(dict.fromkeys(int(metadata[k]) for k in keys if metadata.get(k) is not None))


def config_from_gguf(file: GGUFFile) -> ModelConfig:
    """`ModelConfig` from a llama, qwen2 or gemma3 GGUF's metadata; ValueError names what cannot be served exactly."""
    arch = gguf_architecture(file)
    metadata = file.metadata
    expert_count = metadata.get(f"{arch}.expert_count") or 0
    if expert_count:
        raise ValueError(f"gguf: {arch}.expert_count = {expert_count}: mixture-of-experts models are not supported")
    if _ROPE_FACTORS in file.tensors:
        raise ValueError(
            f"gguf: tensor {_ROPE_FACTORS!r} (per-frequency RoPE factors, as Llama 3.1 uses) is not supported"
        )
    hidden_size = int(_required(metadata, f"{arch}.embedding_length"))
    num_heads = int(_required(metadata, f"{arch}.attention.head_count"))
    head_dim = int(metadata.get(f"{arch}.attention.key_length") or hidden_size // num_heads)
    value_dim = int(metadata.get(f"{arch}.attention.value_length") or head_dim)
    rope_dim = int(metadata.get(f"{arch}.rope.dimension_count") or head_dim)
    if value_dim != head_dim:
        raise ValueError(
            f"gguf: {arch}.attention.value_length ({value_dim}) != key_length ({head_dim}) is not supported"
        )
    if rope_dim != head_dim:
        raise ValueError(
            f"gguf: {arch}.rope.dimension_count ({rope_dim}) != head dim ({head_dim}): "
            "partial rotary embeddings are not supported"
        )
    embedding = file.tensors.get("token_embd.weight")
    vocab_size = metadata.get(f"{arch}.vocab_size") or (embedding.shape[0] if embedding else None)
    if vocab_size is None:
        raise ValueError(f"gguf: neither {arch}.vocab_size nor tensor 'token_embd.weight' is present")
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    extra = gguf_gemma3.config_fields(metadata, hidden_size, num_heads, head_dim) if arch == gguf_gemma3.ARCH else {}
    return ModelConfig(
        vocab_size=int(vocab_size),
        hidden_size=hidden_size,
        intermediate_size=int(_required(metadata, f"{arch}.feed_forward_length")),
        num_layers=int(_required(metadata, f"{arch}.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv") or num_heads),
        head_dim=head_dim,
        max_position_embeddings=int(_required(metadata, f"{arch}.context_length")),
        rms_norm_eps=float(metadata.get(f"{arch}.attention.layer_norm_rms_epsilon", _DEFAULT_RMS_NORM_EPS)),
        rope_theta=float(metadata.get(f"{arch}.rope.freq_base", _DEFAULT_ROPE_THETA)),
        rope_scaling=_rope_scaling(metadata, arch),
        tie_word_embeddings=_OUTPUT not in file.tensors,  # llama.cpp reuses token_embd when output is absent
        attention_bias=ARCHITECTURES[arch].attention_bias,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=_eos_token_ids(metadata),
        architecture=ARCHITECTURES[arch].hf_name,
        **extra,
    )


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The model's parameter name for a GGUF tensor name of architecture `arch`, or None when it has none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    layer_names = ARCHITECTURES[arch].layer_names or _LAYER_NAMES
    if gguf_name.startswith(_LAYER_PREFIX):
        index, _, rest = gguf_name[len(_LAYER_PREFIX) :].partition(".")
        if index.isdigit() and rest in layer_names:
            return f"model.layers.{int(index)}.{layer_names[rest]}"
    return None


def unpermute_qk_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.py `LlamaModel.permute`).

    llama.cpp rotates adjacent pairs (x0, x1), (x2, x3), ... while HF Llama rotates the two
    halves of each head; the converter reorders each head's rows from [first half; second half]
    to interleaved pairs, so this puts every head's rows i and i + head_dim/2 back apart.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _check_type(file: GGUFFile, info: GGUFTensorInfo) -> None:
    if info.ggml_type not in SUPPORTED_TENSOR_TYPES:
        raise ValueError(
            f"gguf: tensor {info.name!r} in {file.path} has type {info.type_name}, which is not "
            f"supported; supported: {[t.name for t in SUPPORTED_TENSOR_TYPES]}"
        )


def dequantize_tensor(file: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """One tensor as a new float32 tensor (shape `info.shape`); ValueError names an unsupported type."""
    _check_type(file, info)
    return dequantize(file.tensor_bytes(info), info.ggml_type, info.shape)


def _check_tensors(file: GGUFFile, model_shapes: dict[str, tuple[int, ...]], arch: str) -> dict[str, str]:
    """GGUF name -> parameter name for every tensor, after checking names, types and shapes."""
    names = {gguf_name: hf_name(gguf_name, arch) for gguf_name in file.tensors}
    unexpected = sorted(g for g, h in names.items() if h is None or h not in model_shapes)
    missing = sorted(set(model_shapes) - set(names.values()))
    if missing or unexpected:
        raise ValueError(f"gguf {file.path}: missing tensors {missing}; unexpected tensors {unexpected}")
    for gguf_name, name in names.items():
        info = file.tensors[gguf_name]
        _check_type(file, info)
        if info.shape != model_shapes[name]:
            raise ValueError(
                f"gguf: tensor {gguf_name!r} in {file.path} has shape {info.shape}, expected {model_shapes[name]}"
            )
    return names


def has_q4_tensors(file: GGUFFile, types: tuple = Q4_TYPES) -> bool:
    """Whether any tensor of `file` has one of `types` (by default the 4-bit ones every kernel reads)."""
    return any(info.ggml_type in types for info in file.tensors.values())


def quantized_unsupported(
    file: GGUFFile, device: torch.device | str, dtype: torch.dtype, quantized_kernel: str = "auto"
) -> str | None:
    """Why `file` cannot be served with quantized weights on `device` in `dtype` by
    `quantized_kernel` ("auto", "vnni", "avx2", "torch"), or None."""
    architecture = file.metadata.get(ARCHITECTURE_KEY)
    if architecture in ARCHITECTURES and not ARCHITECTURES[architecture].quantizable:
        return f"{architecture} models are served with dense weights only, so far"
    if torch.device(device).type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return "quantized weights are served on the CPU in bfloat16 or float32, only"
    ours = quantized_kernel in INT8_KERNELS or (quantized_kernel == "auto" and vnni_kernels.best() is not None)
    if ours and not has_q4_tensors(file, SEGMENT_TYPES):
        names = "/".join(t.name for t in SEGMENT_TYPES)
        return f"{file.path} has no {names} tensors, the only quantized ones minipd's kernels read so far"
    if quantized_kernel in INT8_KERNELS:
        return vnni_kernels.unavailable(quantized_kernel)
    if ours:
        return None
    if not has_q4_tensors(file):
        return f"{file.path} has no Q4_0/Q4_1 tensors, the only 4-bit ones torch's kernel reads"
    none_of_ours = f"none of minipd's kernels runs here ({vnni_kernels.why_none()})"
    if dtype != torch.bfloat16:  # "torch", or "auto" where none of minipd's kernels runs
        why = "" if quantized_kernel == "torch" else f" and {none_of_ours}"
        return f"torch's int4 kernel takes bfloat16 only{why}"
    if not kernel_available():
        return f"no quantized kernel: this torch has no int4 kernel and {none_of_ours}"
    return None


def auto_weights(file: GGUFFile, device: torch.device | str, dtype: torch.dtype, quantized_kernel: str = "auto") -> str:
    """`--weights auto` for `file`: "mixed" in bfloat16 (decode reads the 4-bit weights, prefill
    chunks a dense bf16 copy, which beats the 4-bit kernels from 8 rows on an AVX512-BF16 CPU);
    "quantized" in float32 (minipd's int8 kernels beat a dense float32 matmul at every row count
    measured, 1 to 512, so a float32 dense copy would cost memory and time); "dense" where the
    weights cannot be served quantized (`quantized_unsupported`)."""
    if quantized_unsupported(file, device, dtype, quantized_kernel) is not None:
        return "dense"
    return "mixed" if dtype == torch.bfloat16 else "quantized"


def load_gguf_weights(
    file: GGUFFile,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    weights: str = "dense",
    quantized_kernel: str = "auto",
) -> LlamaForCausalLM:
    """Build the model of an already parsed GGUF file (see `load_gguf_model`); quantized weights
    are multiplied by `quantized_kernel` (`choose_kernel`)."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights: unknown {weights!r}; choose one of {list(WEIGHT_FORMATS)}")
    config = config_from_gguf(file)
    arch = ARCHITECTURES[gguf_architecture(file)]
    shapes = _model_shapes(config, arch.model)
    names = _check_tensors(file, shapes, gguf_architecture(file))
    if weights in QUANTIZED_FORMATS and (why := quantized_unsupported(file, device, dtype, quantized_kernel)):
        raise ValueError(f"weights: {weights}: {why}")
    model = arch.model(config, device=device, dtype=dtype, initialize=False)  # every tensor is loaded below
    unpermute = unpermute_qk_rows if arch.permuted_qk else _rows_as_stored
    served_quantized: set[str] = set()
    if weights in QUANTIZED_FORMATS:
        gguf_names = {h: g for g, h in names.items()}
        kernel = choose_kernel(quantized_kernel)
        served_quantized = attach_quantized(
            model, file, gguf_names, unpermute, dense_copies=weights == "mixed", kernel=kernel
        )
    params = model.state_dict()
    with torch.no_grad():
        for gguf_name, name in names.items():
            if name in served_quantized:
                continue
            values = dequantize_tensor(file, file.tensors[gguf_name])
            if name.endswith("q_proj.weight"):
                values = unpermute(values, config.num_heads)
            elif name.endswith("k_proj.weight"):
                values = unpermute(values, config.num_kv_heads)
            elif name.endswith("norm.weight") and arch.norm_shift:
                values -= arch.norm_shift
            params[name].copy_(values)
            del values  # the float32 copy goes before the next tensor is dequantized
    log_dequantized(file, [g for g, h in names.items() if h not in served_quantized], weights, dtype)
    return model


def _rows_as_stored(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """qwen2's Q/K rows: stored in Hugging Face's order (no permutation to undo)."""
    return weight


def _model_shapes(config: ModelConfig, model_class: type[LlamaForCausalLM]) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of the model `config` describes, without allocating it."""
    model = model_class(config, device="meta", initialize=False)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def load_gguf_model(
    path: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    weights: str = "dense",
    quantized_kernel: str = "auto",
) -> LlamaForCausalLM:
    """Build a `LlamaForCausalLM` (a `Gemma3ForCausalLM` for gemma3) from the llama, qwen2 or
    gemma3 GGUF file at `path`, dequantized to `dtype` on `device` (`weights="quantized"`: its
    4-bit projections kept as stored; "mixed": so, plus their dense copies). Raises
    FileNotFoundError when it does not exist and ValueError naming an unsupported architecture,
    tensor type or feature, or missing/unexpected/misshapen tensors (all checked before the
    model is allocated)."""
    return load_gguf_weights(
        read_gguf(path), device=device, dtype=dtype, weights=weights, quantized_kernel=quantized_kernel
    )
