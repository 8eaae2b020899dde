"""GGUF blocks for the tests, built byte by byte from ggml's block layouts (ggml-common.h), for
the types whose quantizer the `gguf` package lacks (the K-quants):

- `random_blocks(tensor_type, rows, cols, rng)`: valid random blocks of any type minipd reads: random
  bytes for the packed values and the 6-bit and int8 scales (every bit pattern is valid there),
  finite random float16s (with enough blocks, zeros, subnormals and negatives included) for d, dmin and m.
- `quantize(values, tensor_type)`: values written as Q4_K, Q5_K or Q6_K blocks by a plain
  min/max quantizer (not llama.cpp's search for the best scales, but the same layout), so a tiny
  model keeps its weights to within a few percent; any other type goes to `gguf.quants.quantize`.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

Q = GGMLQuantizationType
K_TYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
# Byte offsets of each block's float16 fields.
_F16_FIELDS = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}
_SPECIAL_F16 = np.array([0.0, -0.0, 6e-8, -3e-5, 1.0], dtype=np.float16)  # zero, -0, subnormals, 1


def random_blocks(tensor_type: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Stored bytes [rows, bytes per row] of a random tensor of `tensor_type` (finite values only)."""
    block_values, block_bytes = GGML_QUANT_SIZES[tensor_type]
    if tensor_type in (Q.F32, Q.F16, Q.BF16):
        values = rng.normal(size=(rows, cols)).astype(np.float32)
        if tensor_type == Q.F16:
            return values.astype(np.float16).view(np.uint8)
        if tensor_type == Q.BF16:
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    blocks = rng.integers(0, 256, size=(rows * cols // block_values, block_bytes), dtype=np.uint8)
    for at in _F16_FIELDS.get(tensor_type, ()):  # a type not listed: random bytes throughout
        halves = rng.normal(0, 0.01, size=blocks.shape[0]).astype(np.float16)
        if len(halves) > 2 * len(_SPECIAL_F16):  # a few blocks stay ordinary in any case
            halves[: len(_SPECIAL_F16)] = _SPECIAL_F16
        blocks[:, at : at + 2] = halves.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _round_scale(scale: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-group scales [n, groups] as a float16 super-scale [n] and integer multiples 0..levels of it."""
    top = (scale.max(axis=1) / levels).astype(np.float16)
    safe = np.where(top == 0, 1, top).astype(np.float32)
    return top, np.clip(np.rint(scale / safe[:, None]), 0, levels).astype(np.uint8)


def _pack_k_scales(scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins [n, 8] in Q4_K/Q5_K's 12 bytes (`get_scale_min_k4` in reverse)."""
    low = np.concatenate((scale[:, :4] | ((scale[:, 4:] >> 4) << 6), minimum[:, :4] | ((minimum[:, 4:] >> 4) << 6)), 1)
    return np.concatenate((low, (scale[:, 4:] & 0xF) | ((minimum[:, 4:] & 0xF) << 4)), axis=1)


def _k_quant(x: np.ndarray, bits: int) -> np.ndarray:
    """Q4_K (bits 4) or Q5_K (bits 5) blocks of x [n, 256]."""
    levels = (1 << bits) - 1
    groups = x.reshape(-1, 8, 32)
    low = np.minimum(groups.min(axis=2), 0)  # the format's offset is -dmin * min <= 0
    d, scale = _round_scale((groups.max(axis=2) - low) / levels, 63)
    dmin, minimum = _round_scale(-low, 63)
    step = d.astype(np.float32)[:, None] * scale
    offset = dmin.astype(np.float32)[:, None] * minimum
    safe = np.where(step == 0, 1, step)
    q = np.clip(np.rint((groups + offset[:, :, None]) / safe[:, :, None]), 0, levels).astype(np.uint8)
    nibbles = (q & 0xF).reshape(-1, 4, 2, 32)
    packed = [_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(scale, minimum)]
    if bits == 5:
        fifth = (q >> 4).reshape(-1, 8, 32)
        packed.append(np.bitwise_or.reduce(fifth << np.arange(8, dtype=np.uint8)[:, None], axis=1).astype(np.uint8))
    packed.append((nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)).reshape(-1, 128))
    return np.concatenate(packed, axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    groups = x.reshape(-1, 16, 16)
    scale = np.abs(groups).max(axis=2) / 31
    d = (scale.max(axis=1) / 127).astype(np.float16)
    safe_d = np.where(d == 0, 1, d).astype(np.float32)
    scales = np.clip(np.rint(scale / safe_d[:, None]), 0, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * scales
    safe = np.where(step == 0, 1, step)
    q = (np.clip(np.rint(groups / safe[:, :, None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)
    low = (q & 0xF).reshape(-1, 2, 2, 64)
    high = (q >> 4).reshape(-1, 2, 4, 32)
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    return np.concatenate((ql, qh, scales.view(np.uint8), _f16_bytes(d)), axis=1)


def quantize(values: np.ndarray, tensor_type: GGMLQuantizationType) -> np.ndarray:
    """`values` [rows, cols] stored as `tensor_type`: bytes [rows, bytes per row]."""
    values = np.asarray(values, dtype=np.float32)
    if tensor_type not in K_TYPES:
        return gguf_quantize(values, tensor_type)
    rows, cols = values.shape
    if cols % 256:
        raise ValueError(f"{tensor_type.name} needs rows of a multiple of 256 values, not {cols}")
    x = values.reshape(-1, 256)
    blocks = {Q.Q4_K: lambda: _k_quant(x, 4), Q.Q5_K: lambda: _k_quant(x, 5), Q.Q6_K: lambda: _q6_k(x)}[tensor_type]()
    assert blocks.shape[1] == GGML_QUANT_SIZES[tensor_type][1]
    return blocks.reshape(rows, -1)
