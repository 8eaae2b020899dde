"""GGUF's quantized tensors served as stored, in `QuantizedLinear` modules: Q4_0/Q4_1 (any kernel); with
minipd's int8 kernels also Q8_0, Q5_0, Q4_K and Q6_K (kquant_segments.py).

`q4_values` reads a Q4_0/Q4_1 tensor's blocks (ggml's `block_q4_0` / `block_q4_1`: a float16
d, for Q4_1 a float16 m, then 16 bytes whose low nibbles are elements 0..15 of the block and
high nibbles 16..31) into q (0..15), scale and zero with w = (q - 8) * scale + zero, which
equals GGUF's own dequantization in float32 (Q4_0: scale d, zero 0; Q4_1: scale d,
zero m + 8d, exact in float32 since 8d is).

`q8_values` reads a Q8_0 tensor's blocks (`block_q8_0`: a float16 d, then 32 int8 q; w = d * q).

`attach_quantized` gives a model's projections that are stored in 4 bits (each fused group --
q/k/v, gate/up -- only when every part is, and the kernel takes its shape), or with minipd's
kernels in any mix of kquant_segments.SEGMENT_TYPES (one segment per part: a Q4_K_M file's q/k/v
are Q4_K, Q4_K, Q6_K), a `QuantizedLinear` (with its dense copy for prefill rows when asked:
weights "mixed"; for segments, GGUF's own dequantization in the model's dtype); qwen2's q/k/v
biases stay dense and are added to the product (arch/llama.py). It
returns the parameter names it replaced, which the loader then skips. With minipd's kernels
("vnni", "avx2") the lm_head is served from its blocks too when they are of those types, a tied one (the
embedding) included: the embedding's dense table then stays for the input lookups, and the
lm_head reads the blocks (SmolLM2: 31.9 MB of Q8_0 instead of 56.6 MB of bf16 a token); where
they are Q8_0 the input lookups read them too (weights/block_embedding.py) and no dense table is kept.
Everything else (norms, the embedding, other Q8_0 and float tensors) stays dense. The blocks
are laid side by side on transparent huge pages where Linux gives them (weights/huge_pages.py).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType

from minipd.models.arch.llama import LlamaForCausalLM
from minipd.models.gguf.gguf_dequantize import dequantize
from minipd.models.gguf.gguf_file import GGUFFile, GGUFTensorInfo
from minipd.models.gguf.kquant_segments import block_segment, segment_fits
from minipd.models.weights.huge_pages import to_huge_pages
from minipd.models.weights.quantized_linear import GROUP_SIZE, INT8_KERNELS, QuantizedLinear

Q4_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)
Q8_0 = GGMLQuantizationType.Q8_0
Q4Values = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q [out, in], scale and zero [out, in / 32]


def q4_values(file: GGUFFile, info: GGUFTensorInfo) -> Q4Values:
    """q, scale and zero of a Q4_0/Q4_1 tensor (see the module docstring)."""
    q4_1 = info.ggml_type == GGMLQuantizationType.Q4_1
    if info.ggml_type not in Q4_TYPES:
        raise ValueError(f"gguf: tensor {info.name!r} has type {info.type_name}, not a 4-bit type")
    rows, cols = info.shape
    header = 4 if q4_1 else 2
    blocks = np.asarray(file.tensor_bytes(info)).reshape(rows, cols // GROUP_SIZE, header + GROUP_SIZE // 2)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0]).float()
    nibbles = torch.from_numpy(blocks[..., header:].copy())
    q = torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1).reshape(rows, cols)
    if not q4_1:
        return q, d, torch.zeros_like(d)
    m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]).float()
    return q, d, m + 8 * d


def q8_values(file: GGUFFile, info: GGUFTensorInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """q (int8 [out, in]) and d (float32 [out, in / 32]) of a Q8_0 tensor (w = d * q)."""
    if info.ggml_type != Q8_0:
        raise ValueError(f"gguf: tensor {info.name!r} has type {info.type_name}, not Q8_0")
    rows, cols = info.shape
    blocks = np.asarray(file.tensor_bytes(info)).reshape(rows, cols // GROUP_SIZE, 2 + GROUP_SIZE)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0]).float()
    return torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).reshape(rows, cols), d


def _unpermute(values: Q4Values, num_heads: int, unpermute_rows) -> Q4Values:
    # llama.cpp's Q/K permutation moves whole rows, and every row's groups move with it.
    return tuple(unpermute_rows(v, num_heads) for v in values)  # type: ignore[return-value]


def attach_quantized(
    model: LlamaForCausalLM,
    file: GGUFFile,
    gguf_names: dict[str, str],
    unpermute_rows,
    dense_copies: bool = False,
    kernel: str = "torch",
) -> set[str]:
    """Serve the 4-bit projections of `model` from their blocks, each with its dense copy when
    `dense_copies` (in the model's dtype), multiplied by `kernel` ("vnni", "avx2" or "torch");
    returns the parameter names now served quantized (no longer in the model's state dict).
    `gguf_names`: parameter name -> GGUF tensor name; `unpermute_rows(tensor, heads)` undoes
    llama.cpp's Q/K row order."""
    config = model.config
    dense_dtype = model.model.norm.weight.dtype

    def info(name: str) -> GGUFTensorInfo:
        return file.tensors[gguf_names[name]]

    def rows_of(name: str):  # llama.cpp's Q/K row order undone (per-row values of any shape)
        if name.endswith("q_proj.weight"):
            return lambda t: unpermute_rows(t, config.num_heads)
        if name.endswith("k_proj.weight"):
            return lambda t: unpermute_rows(t, config.num_kv_heads)
        return lambda t: t

    def segments(names: list[str]) -> QuantizedLinear | None:  # any of SEGMENT_TYPES, minipd's kernels only
        if kernel not in INT8_KERNELS or not all(segment_fits(info(n)) for n in names):
            return None
        parts = [block_segment(file, info(n), rows_of(n)) for n in names]
        dense = None
        if dense_copies:
            exact = [dequantize(file.tensor_bytes(info(n)), info(n).ggml_type, info(n).shape) for n in names]
            dense = torch.cat([rows_of(n)(values) for n, values in zip(names, exact)])
        replaced.update(names)
        return QuantizedLinear.from_segments(parts, info(names[0]).shape[1], kernel, dense, dense_dtype)

    def group(names: list[str]) -> QuantizedLinear | None:
        if not all(info(n).ggml_type in Q4_TYPES for n in names):
            return segments(names)
        out_features = sum(info(n).shape[0] for n in names)
        if not QuantizedLinear.supports(out_features, info(names[0]).shape[1]):
            return None
        parts = []
        for n in names:
            values = q4_values(file, info(n))
            if n.endswith("q_proj.weight"):
                values = _unpermute(values, config.num_heads, unpermute_rows)
            elif n.endswith("k_proj.weight"):
                values = _unpermute(values, config.num_kv_heads, unpermute_rows)
            parts.append(values)
        replaced.update(names)
        return QuantizedLinear.concat(parts, keep_dense=dense_copies, kernel=kernel, dense_dtype=dense_dtype)

    def head(name: str) -> QuantizedLinear | None:  # minipd's kernels only: torch's keeps the old rule
        tensor = info(name)
        if not QuantizedLinear.supports(*tensor.shape):
            return None
        if tensor.ggml_type == Q8_0:
            linear = QuantizedLinear.from_q8(*q8_values(file, tensor), kernel=kernel)
        elif tensor.ggml_type in Q4_TYPES:
            linear = QuantizedLinear.from_q4(*q4_values(file, tensor), kernel=kernel)
        elif segment_fits(tensor):
            linear = QuantizedLinear.from_segments([block_segment(file, tensor)], tensor.shape[1], kernel)
        else:
            return None
        if name == "lm_head.weight":
            replaced.add(name)  # a tied head is the embedding: its dense table is still loaded
        return linear

    replaced: set[str] = set()
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        qkv = group([p + f"self_attn.{x}_proj.weight" for x in "qkv"])  # qwen2's biases stay dense, added after
        layer.self_attn.use_quantized(qkv, group([p + "self_attn.o_proj.weight"]))
        layer.mlp.use_quantized(
            group([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]), group([p + "mlp.down_proj.weight"])
        )
    if kernel in INT8_KERNELS:
        tied = config.tie_word_embeddings
        if model.use_quantized_lm_head(head("model.embed_tokens.weight" if tied else "lm_head.weight")):
            replaced.add("model.embed_tokens.weight")  # looked up in the head's blocks: no table to load
    elif not config.tie_word_embeddings:
        model.use_quantized_lm_head(group(["lm_head.weight"]))
    # What every decode step streams goes onto huge pages where Linux gives them (weights/huge_pages.py).
    linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    for linear, packed in zip(linears, to_huge_pages([m.packed for m in linears])):
        linear.packed = packed
    return replaced
