"""Tiny llama and qwen2 GGUF files written with the `gguf` package's GGUFWriter, the way llama.cpp's
convert_hf_to_gguf.py writes them (llama's Q/K rows permuted, qwen2's as HF has them; norms and
biases in F32), from known HF-layout weights, with a tiny vocabulary or one given (`GGUFVocab`);
and the locations of the real SmolLM2 file for the tests that use it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, TokenType
from gguf_blocks import quantize, random_blocks

from minipd.models.arch.model_config import ModelConfig
from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS

SMOLLM2 = PACKAGED_MODELS["smollm2"]
requires_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec(SMOLLM2.package) is None, reason=f"the SmolLM2 GGUF is not installed ({SMOLLM2.install})"
)


# Plain English prose for SmolLM2's teacher-forced comparisons (more than 256 tokens).
PROSE = (
    "The history of the lighthouse begins with fires lit on hilltops to guide ships home at night. "
    "Over the centuries these fires moved into towers, and the towers grew taller and brighter as "
    "engineers learned to focus light with mirrors and, later, with lenses. The most famous of these "
    "lenses was designed by a French physicist who arranged rings of glass prisms around a lamp so "
    "that almost all of its light left in a narrow, powerful beam. Keepers lived in small houses at "
    "the foot of each tower. They trimmed wicks, polished brass, wound the clockwork that turned the "
    "lens, and wrote the weather into thick logbooks every few hours. On stormy nights they did not "
    "sleep at all. Today most lighthouses run by themselves: electric lamps switch on at dusk, sensors "
    "report faults over radio, and satellites have replaced many of them as the sailor's first guide. "
    "Yet people still visit them in great numbers, climbing the narrow spiral stairs to stand in the "
    "wind at the top and look out over the water, imagining the long nights of the keepers who once "
    "lived there and the ships that found their way past the rocks because a light was burning. "
    "Some towers have become museums, others small hotels, and a few are still kept by volunteers "
    "who repaint the stripes every summer and tell visitors stories about storms, shipwrecks and "
    "rescues that happened long before they were born. The sea has not changed very much at all."
)


def smollm2_dir() -> Path:
    return Path(next(iter(importlib.util.find_spec(SMOLLM2.package).submodule_search_locations)))


TINY = ModelConfig(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_ids=(2,),
)

GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
# Types neither gguf's quantizer nor the K-quant writer makes: written as random blocks (minipd refuses them).
RANDOM_BLOCK_TYPES = (GGMLQuantizationType.IQ4_NL, GGMLQuantizationType.Q2_K, GGMLQuantizationType.Q3_K)
PERMUTED_QK_ARCHS = ("llama",)  # llama.cpp's converter interleaves llama's Q/K rows, not qwen2's


class GGUFVocab(NamedTuple):
    """A byte-level BPE vocabulary as a GGUF's tokenizer metadata holds it."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos_token_id: int
    eos_token_id: int
    add_bos: bool | None = None
    chat_template: str | None = None


def tiny_vocab(config: ModelConfig) -> GGUFVocab:
    """Three special tokens, single printable ASCII characters, and one merged token '!"'."""
    tokens = ["<unk>", "<s>", "</s>", *[chr(ord("!") + i) for i in range(config.vocab_size - 4)], '!"']
    types = [TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (config.vocab_size - 3)
    return GGUFVocab(tokens, types, ['! "'], "default", config.bos_token_id, config.eos_token_ids[0])


def hf_weights(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 weights in HF Llama layout (norms near 1 so the model is well behaved)."""
    gen = torch.Generator().manual_seed(seed)
    h, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (config.num_heads * d, h),
                p + "self_attn.k_proj.weight": (config.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (config.num_kv_heads * d, h),
                p + "self_attn.o_proj.weight": (h, config.num_heads * d),
                p + "mlp.gate_proj.weight": (f, h),
                p + "mlp.up_proj.weight": (f, h),
                p + "mlp.down_proj.weight": (h, f),
            }
        )
    weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            weights[name] = 1 + 0.1 * torch.randn(shape, generator=gen)
        else:
            weights[name] = torch.randn(shape, generator=gen) * shape[-1] ** -0.5
    return weights


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `LlamaModel.permute`: HF's half-split rotary rows -> llama.cpp's pairs."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_tensors(
    config: ModelConfig, weights: dict[str, torch.Tensor], permute_qk: bool = True
) -> dict[str, np.ndarray]:
    """HF weights under their GGUF names, Q/K permuted as llama.cpp stores llama's (`permute_qk`)."""
    out = {
        "token_embd.weight": weights["model.embed_tokens.weight"].numpy(),
        "output_norm.weight": weights["model.norm.weight"].numpy(),
    }
    if "lm_head.weight" in weights:
        out["output.weight"] = weights["lm_head.weight"].numpy()
    for i in range(config.num_layers):
        for hf, gg in GGUF_LAYER_NAMES.items():
            if f"model.layers.{i}.{hf}" not in weights:
                continue  # left out on purpose (a file with a missing tensor)
            values = weights[f"model.layers.{i}.{hf}"].numpy()
            if permute_qk and hf == "self_attn.q_proj.weight":
                values = llama_cpp_permute(values, config.num_heads)
            elif permute_qk and hf == "self_attn.k_proj.weight":
                values = llama_cpp_permute(values, config.num_kv_heads)
            out[f"blk.{i}.{gg}"] = values
    return out


def stored(values: np.ndarray, tensor_type: GGMLQuantizationType) -> np.ndarray:
    """`values` as GGUFWriter.add_tensor takes them for `tensor_type` (F32/F16 as floats, the rest as
    bytes: gguf's quantizer, the tests' K-quant writer, or random blocks for `RANDOM_BLOCK_TYPES`)."""
    if tensor_type == GGMLQuantizationType.F32:
        return values.astype(np.float32)
    if tensor_type == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    if tensor_type in RANDOM_BLOCK_TYPES:
        return random_blocks(tensor_type, *values.shape, np.random.default_rng(0))
    return quantize(values.astype(np.float32), tensor_type)


def write_llama_gguf(
    path: Path,
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    tensor_type: GGMLQuantizationType = GGMLQuantizationType.F32,
    arch: str = "llama",
    extra_metadata: dict[str, Any] | None = None,
    tensor_types: dict[str, GGMLQuantizationType] | None = None,
    vocab: GGUFVocab | None = None,
) -> Path:
    """A GGUF file of `weights`: matrices stored as `tensor_type` (per-name overrides in
    `tensor_types`), 1-D norms and biases as F32, plus `arch` metadata and `vocab` (by default
    `tiny_vocab`)."""
    writer = GGUFWriter(str(path), arch)
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    metadata: dict[str, tuple[Any, GGUFValueType]] = {
        f"{arch}.block_count": (config.num_layers, u32),
        f"{arch}.context_length": (config.max_position_embeddings, u32),
        f"{arch}.embedding_length": (config.hidden_size, u32),
        f"{arch}.feed_forward_length": (config.intermediate_size, u32),
        f"{arch}.attention.head_count": (config.num_heads, u32),
        f"{arch}.attention.head_count_kv": (config.num_kv_heads, u32),
        f"{arch}.rope.dimension_count": (config.head_dim, u32),
        f"{arch}.rope.freq_base": (config.rope_theta, f32),
        f"{arch}.attention.layer_norm_rms_epsilon": (config.rms_norm_eps, f32),
        f"{arch}.vocab_size": (config.vocab_size, u32),
    }
    for key, value in (extra_metadata or {}).items():
        metadata[key] = (value, GGUFValueType.STRING if isinstance(value, str) else u32)
    for key, (value, value_type) in metadata.items():
        writer.add_key_value(key, value, value_type)
    vocab = vocab or tiny_vocab(config)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos_token_id)
    writer.add_eos_token_id(vocab.eos_token_id)
    if vocab.add_bos is not None:
        writer.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template is not None:
        writer.add_chat_template(vocab.chat_template)
    for name, values in gguf_tensors(config, weights, permute_qk=arch in PERMUTED_QK_ARCHS).items():
        kind = (tensor_types or {}).get(name, GGMLQuantizationType.F32 if values.ndim == 1 else tensor_type)
        writer.add_tensor(
            name,
            stored(values, kind),
            raw_dtype=None if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else kind,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
