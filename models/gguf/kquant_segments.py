"""GGUF tensors of the types minipd's int8 kernels read besides Q4_0/Q4_1's own path, packed as
`Segment`s of one block format (weights/quantized_linear.py `from_segments`).

Contract, per type (`block_segment`), the stored values kept exactly, so that the packed weights
dequantize to GGUF's own float32 values bit for bit (`QuantizedLinear.dequantize`):
- Q4_0, Q4_1: Q4 blocks, d and m as stored (Q4_0: m = -8d, exact in float16).
- Q8_0: Q8 blocks as stored. Q5_0: Q8 blocks of q - 16 (-16..15) with its d: lossless, at
  1.125 bytes a weight instead of 0.6875 (one more kernel format was not worth it for the 0.5B).
- Q4_K: Q4_K tiles (kquant_packing.py) of its q, 6-bit scales and mins, d and dmin.
- Q6_K: Q6_K tiles of its q, int8 scales and d.
Q4_K and Q6_K need inputs in multiples of 256 (GGUF's super-blocks always are) and every type
outputs in multiples of 16 (`segment_fits`); Q5_1 and Q5_K are not read (dequantized instead).
`rows` reorders a tensor's rows (llama.cpp's Q/K permutation undone) on every per-row value.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from minipd.models.gguf.gguf_dequantize import q4_k_parts, q5_0_parts, q6_k_parts
from minipd.models.gguf.gguf_file import GGUFFile, GGUFTensorInfo
from minipd.models.kernels import kquant_packing, vnni_kernels
from minipd.models.kernels.kquant_packing import FORMATS
from minipd.models.weights.quantized_linear import OUT_MULTIPLE, Segment

Q = GGMLQuantizationType
SEGMENT_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K)
_K_TYPES = (Q.Q4_K, Q.Q6_K)


def segment_fits(info: GGUFTensorInfo) -> bool:
    """Whether `info`'s tensor can be a `block_segment`: a 2-D tensor of SEGMENT_TYPES whose
    outputs are a multiple of 16 (and inputs of 256 for the K-quants)."""
    if info.ggml_type not in SEGMENT_TYPES or len(info.shape) != 2:
        return False
    out, cols = info.shape
    return out % OUT_MULTIPLE == 0 and cols % (256 if info.ggml_type in _K_TYPES else 32) == 0


def _t(values: np.ndarray, out: int) -> torch.Tensor:
    """Per-block numpy values [out * blocks, ...] as a torch tensor [out, blocks * ...]."""
    return torch.from_numpy(np.ascontiguousarray(values)).reshape(out, -1)


def block_segment(
    file: GGUFFile, info: GGUFTensorInfo, rows: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> Segment:
    """`info`'s tensor packed for minipd's kernels, its rows through `rows`; ValueError where it does
    not `segment_fits`."""
    if not segment_fits(info):
        raise ValueError(f"gguf: tensor {info.name!r} ({info.type_name}, {info.shape}) cannot be packed into blocks")
    out, cols = info.shape
    blocks = np.asarray(file.tensor_bytes(info)).reshape(-1, GGML_QUANT_SIZES[info.ggml_type][1])
    kind = info.ggml_type
    if kind in (Q.Q4_0, Q.Q4_1):
        q = np.concatenate((blocks[:, -16:] & 0xF, blocks[:, -16:] >> 4), axis=1)
        d = blocks[:, 0:2].copy().view(np.float16)
        m = blocks[:, 2:4].copy().view(np.float16) if kind == Q.Q4_1 else (-8 * d.astype(np.float32)).astype(np.float16)
        q, d, m = (rows(_t(v, out)) for v in (q, d, m))
        return Segment(FORMATS["q4"], vnni_kernels.pack_q4(q, d, m), out)
    if kind in (Q.Q8_0, Q.Q5_0):
        if kind == Q.Q8_0:
            q, d = blocks[:, 2:].view(np.int8), blocks[:, 0:2].copy().view(np.float16)
        else:
            q5, d = q5_0_parts(blocks)
            q = (q5.astype(np.int16) - 16).astype(np.int8)
        q, d = rows(_t(q, out)), rows(_t(d, out))
        return Segment(FORMATS["q8"], vnni_kernels.pack_q8(q, d), out)
    if kind == Q.Q4_K:
        q, sc, m, d, dmin = (rows(_t(v, out)) for v in q4_k_parts(blocks))
        return Segment(FORMATS["q4_k"], kquant_packing.pack_q4k(q, sc, m, d, dmin), out)
    q, sc, d = (rows(_t(v, out)) for v in q6_k_parts(blocks))
    return Segment(FORMATS["q6_k"], kquant_packing.pack_q6k(q, sc, d), out)
