"""GGUF's tensor types decoded to float32 with numpy: F32, F16, BF16, the legacy blocks of 32
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the K-quants' super-blocks of 256 (Q4_K, Q5_K, Q6_K).

Contract: `dequantize(raw, tensor_type, shape)` returns the same float32 values, bit for bit, as
the `gguf` package's reference `gguf.quants.dequantize` (and so as llama.cpp's `dequantize_row_*`):
each format below is decoded into its integer values q and its float32 per-group scale (and
offset), then combined with the same float32 operations in the same order. minipd owns these
layouts rather than calling `gguf.quants` because the quantized kernels for the K-quants need
exactly this unpacking (`q4_k_parts`, `q6_k_parts`, `q5_0_parts`: the stored integers and
scales) (numpy, not torch: torch's uint8 ops on two threads ran 5-10x
slower than numpy's on a busy 2-core machine, the threads waiting on each other). Blocks (ggml's
`block_*` structs in ggml-common.h; little-endian; d, dmin, m are float16):

- Q4_0 (18 bytes / 32): d, 16 bytes of nibbles (low: elements 0..15, high: 16..31); w = d * (q - 8).
- Q4_1 (20 / 32): d, m, nibbles as Q4_0; w = d * q + m.
- Q5_0 (22 / 32): d, qh (32 bits: bit i is element i's fifth bit), nibbles; w = d * (q - 16).
- Q5_1 (24 / 32): d, m, qh, nibbles; w = d * q + m.
- Q8_0 (34 / 32): d, 32 int8 q; w = q * d.
- Q4_K (144 / 256): d, dmin, 12 bytes of eight 6-bit scales and eight 6-bit mins (packed as
  `get_scale_min_k4`), then four runs of 32 bytes, run j holding sub-blocks 2j (low nibbles) and
  2j+1 (high); per sub-block s of 32: w = (d * scale_s) * q - (dmin * min_s).
- Q5_K (176 / 256): d, dmin, the 12 scale bytes, qh (32 bytes: bit s of byte l is the fifth bit of
  element l of sub-block s), then nibbles as Q4_K; w as Q4_K with q of 5 bits.
- Q6_K (210 / 256): ql (128 bytes), qh (64), 16 int8 scales, d; two halves of 128 elements, half
  h's element 64k + l (k < 2, l < 64) has low bits ql[64h + l] >> 4k and element 32k + l (k < 4,
  l < 32) high bits (qh[32h + l] >> 2k) & 3; per group g of 16: w = (d * scale_g) * (q - 32).

Any other type is a ValueError naming it (the loader refuses such a file by tensor name first).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
# Values decoded per step: bounds the temporaries (a few times this many float32s) whatever the tensor's size.
CHUNK_VALUES = 1 << 20
_U8 = np.uint8


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block, as float32 [n, 1]."""
    return np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[n, ..., k] bytes -> [n, ..., 2, k]: the low nibbles, then the high ones."""
    return np.stack((packed & _U8(0xF), packed >> _U8(4)), axis=-2)


def _bits(packed: np.ndarray, count: int) -> np.ndarray:
    """[n, k] bytes -> [n, count, k]: plane i holds bit i of every byte."""
    shifts = np.arange(count, dtype=_U8)[:, None]
    return (packed[:, None, :] >> shifts) & _U8(1)


def _fifth_bits_of_32(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's qh (4 bytes, one little-endian uint32) -> [n, 32]: element i's bit is bit i."""
    return _bits(qh, 8).transpose(0, 2, 1).reshape(-1, 32)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> the eight 6-bit scales and eight 6-bit mins, as float32 [n, 8].
    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes 4-7 the same
    for the mins, bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and of mins 4-7 (high)."""
    scales, mins, low = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scale = np.concatenate((scales & _U8(0x3F), (low & _U8(0xF)) | ((scales >> _U8(2)) & _U8(0x30))), axis=1)
    minimum = np.concatenate((mins & _U8(0x3F), (low >> _U8(4)) | ((mins >> _U8(2)) & _U8(0x30))), axis=1)
    return scale.astype(np.float32), minimum.astype(np.float32)


def _signed(q: np.ndarray, zero: int) -> np.ndarray:
    """Unsigned q minus the format's zero point, as float32 (exact: |q| < 2^8)."""
    return (q.astype(np.int16) - np.int16(zero)).astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * _signed(_nibbles(b[:, 2:18]).reshape(-1, 32), 8)


def _q4_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 4:20]).reshape(-1, 32)
    return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _q5_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 6:22]).reshape(-1, 32) | (_fifth_bits_of_32(b[:, 2:6]) << _U8(4))
    return _f16(b, 0) * _signed(q, 16)


def _q5_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 8:24]).reshape(-1, 32) | (_fifth_bits_of_32(b[:, 4:8]) << _U8(4))
    return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _q8_0(b: np.ndarray) -> np.ndarray:
    return b[:, 2:34].view(np.int8).astype(np.float32) * _f16(b, 0)


def _k_quant(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K from their q [n, 8, 32]: per sub-block, (d * scale) * q - dmin * min."""
    scale, minimum = _k_scales(b[:, 4:16])
    step = (_f16(b, 0) * scale)[:, :, None]
    offset = (_f16(b, 2) * minimum)[:, :, None]
    return (step * q.astype(np.float32) - offset).reshape(-1, 256)


def _q4_k(b: np.ndarray) -> np.ndarray:
    return _k_quant(b, _nibbles(b[:, 16:144].reshape(-1, 4, 32)).reshape(-1, 8, 32))


def _q5_k(b: np.ndarray) -> np.ndarray:
    low = _nibbles(b[:, 48:176].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    return _k_quant(b, low | (_bits(b[:, 16:48], 8) << _U8(4)))


def _q6_k(b: np.ndarray) -> np.ndarray:
    low = _nibbles(b[:, 0:128].reshape(-1, 2, 64)).reshape(-1, 256)
    shifts = np.array([0, 2, 4, 6], dtype=_U8)[:, None]
    high = ((b[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & _U8(3)).reshape(-1, 256)
    step = (_f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
    return (step * _signed(low | (high << _U8(4)), 32).reshape(-1, 16, 16)).reshape(-1, 256)


def q5_0_parts(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q5_0 blocks [n, 22] -> q (uint8 0..31 [n, 32]) and d (float16 [n]); w = d * (q - 16)."""
    q = _nibbles(b[:, 6:22]).reshape(-1, 32) | (_fifth_bits_of_32(b[:, 2:6]) << _U8(4))
    return q, np.ascontiguousarray(b[:, 0:2]).view(np.float16)[:, 0]


def q4_k_parts(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Q4_K blocks [n, 144] -> q (uint8 0..15 [n, 256]), the sub-blocks' scales and mins (uint8
    0..63 [n, 8]), d and dmin (float16 [n]): w = (d * scale) * q - dmin * min per sub-block of 32."""
    scale, minimum = _k_scales(b[:, 4:16])
    q = _nibbles(b[:, 16:144].reshape(-1, 4, 32)).reshape(-1, 256)
    halves = np.ascontiguousarray(b[:, 0:4]).view(np.float16)
    return q, scale.astype(_U8), minimum.astype(_U8), halves[:, 0], halves[:, 1]


def q6_k_parts(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K blocks [n, 210] -> q (uint8 0..63 [n, 256]), the groups' scales (int8 [n, 16]) and d
    (float16 [n]): w = (d * scale) * (q - 32) per group of 16."""
    low = _nibbles(b[:, 0:128].reshape(-1, 2, 64)).reshape(-1, 256)
    shifts = np.array([0, 2, 4, 6], dtype=_U8)[:, None]
    high = ((b[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & _U8(3)).reshape(-1, 256)
    return (
        low | (high << _U8(4)),
        b[:, 192:208].view(np.int8),
        np.ascontiguousarray(b[:, 208:210]).view(np.float16)[:, 0],
    )


def _bf16(b: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(b).view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


_DECODERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    Q.F32: lambda b: np.ascontiguousarray(b).view(np.float32),
    Q.F16: lambda b: np.ascontiguousarray(b).view(np.float16).astype(np.float32),
    Q.BF16: _bf16,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q8_0: _q8_0,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}
DEQUANTIZED_TYPES = tuple(_DECODERS)
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)


def _decoder(tensor_type: GGMLQuantizationType) -> Callable[[np.ndarray], np.ndarray]:
    decoder = _DECODERS.get(tensor_type)
    if decoder is None:
        raise ValueError(f"gguf: no decoder for tensor type {Q(tensor_type).name}")
    return decoder


def dequantize_blocks(blocks: np.ndarray, tensor_type: GGMLQuantizationType) -> np.ndarray:
    """Whole blocks of `tensor_type` (uint8 [n, bytes per block]) as float32 [n, values per block]."""
    decoder = _decoder(tensor_type)
    block_bytes = GGML_QUANT_SIZES[tensor_type][1]
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] != block_bytes:
        raise ValueError(f"gguf: {Q(tensor_type).name} blocks must be uint8 [n, {block_bytes}], not {blocks.shape}")
    return decoder(blocks)


def dequantize(raw: np.ndarray, tensor_type: GGMLQuantizationType, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor's stored bytes (`raw`, any shape holding its blocks in order, e.g. a read-only
    memory map) as a new float32 tensor of `shape`, decoded `CHUNK_VALUES` values at a time."""
    decoder = _decoder(tensor_type)
    block_values, block_bytes = GGML_QUANT_SIZES[tensor_type]
    blocks = np.asarray(raw).reshape(-1, block_bytes)
    if blocks.shape[0] * block_values != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"gguf: {blocks.shape[0]} {Q(tensor_type).name} blocks do not hold a tensor of shape {shape}")
    out = np.empty((blocks.shape[0], block_values), dtype=np.float32)
    step = max(1, CHUNK_VALUES // block_values)
    for start in range(0, blocks.shape[0], step):
        out[start : start + step] = decoder(blocks[start : start + step])
    return torch.from_numpy(out.reshape(shape))
