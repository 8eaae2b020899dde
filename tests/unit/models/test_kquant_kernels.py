"""minipd's K-quant kernels (models/kernels/kquant_tiles.h, block_matmul.h) on tiny generated
blocks, for each variant that runs here ("vnni"; "avx2" forced too, as the AVX2-only EPYCs run it):

- packing keeps the file's values: a packed Q4_K/Q6_K/Q5_0 tensor dequantizes to GGUF's own
  float32 values bit for bit (random blocks, every bit pattern of the scales);
- exact arithmetic: Q4_K gives the Q4 kernel's bits where d * sc and dmin * m are float16 values,
  and Q6_K the Q8_0 kernel's where sc * (q - 32) fits int8 (the tiles' header states both);
- on random blocks the output is the int8-rounded activations times the file's weights, within
  float32 summation (and one bfloat16 step for bfloat16 outputs);
- a weight of mixed segments (Q4_K, Q6_K, Q8) gives each segment's own outputs, and every
  variant gives the same bits; bad segments are refused with the op still serving.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf_blocks import random_blocks
from int8_reference import assert_int8_product

from minipd.models.gguf.gguf_dequantize import dequantize, q4_k_parts, q5_0_parts, q6_k_parts
from minipd.models.kernels import kquant_packing, vnni_kernels
from minipd.models.kernels.kquant_packing import FORMATS
from minipd.models.weights.quantized_linear import QuantizedLinear, Segment

VARIANTS = [
    pytest.param(v, marks=pytest.mark.skipif(bool(why), reason=f"no {v} kernels here: {why}"))
    for v, why in ((v, vnni_kernels.unavailable(v)) for v in vnni_kernels.VARIANTS)
]
RUNNABLE = [v for v in vnni_kernels.VARIANTS if vnni_kernels.unavailable(v) is None]
DTYPES = [torch.bfloat16, torch.float32]
Q = GGMLQuantizationType
OUT, IN, ROWS = 32, 512, 11  # two super-blocks; 11 rows: a full pass of 8 (4 on AVX2) and a partial one


def _raw(tensor_type, out: int = OUT, in_: int = IN, seed: int = 0) -> np.ndarray:
    return random_blocks(tensor_type, out, in_, np.random.default_rng(seed))


def _t(values: np.ndarray, out: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values)).reshape(out, -1)


def _segment(tensor_type, raw: np.ndarray, out: int) -> Segment:
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[tensor_type][1])
    if tensor_type == Q.Q4_K:
        q, sc, m, d, dmin = (_t(v, out) for v in q4_k_parts(blocks))
        return Segment(FORMATS["q4_k"], kquant_packing.pack_q4k(q, sc, m, d, dmin), out)
    if tensor_type == Q.Q6_K:
        q, sc, d = (_t(v, out) for v in q6_k_parts(blocks))
        return Segment(FORMATS["q6_k"], kquant_packing.pack_q6k(q, sc, d), out)
    q, d = q5_0_parts(blocks)
    q8 = _t((q.astype(np.int16) - 16).astype(np.int8), out)
    return Segment(FORMATS["q8"], vnni_kernels.pack_q8(q8, _t(d, out)), out)


def _linear(tensor_type, variant: str, seed: int = 0) -> tuple[QuantizedLinear, torch.Tensor]:
    raw = _raw(tensor_type, seed=seed)
    expected = dequantize(raw, tensor_type, (OUT, IN))
    return QuantizedLinear.from_segments([_segment(tensor_type, raw, OUT)], IN, variant), expected


def _x(dtype, seed: int = 1, rows: int = ROWS) -> torch.Tensor:
    return torch.randn(rows, IN, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("tensor_type", [Q.Q4_K, Q.Q6_K, Q.Q5_0], ids=lambda t: t.name)
def test_packing_keeps_the_files_values_bit_for_bit(tensor_type) -> None:
    raw = _raw(tensor_type, seed=3)
    segment = _segment(tensor_type, raw, OUT)
    packed_bytes = segment.packed.numel()
    bytes_per_weight = {Q.Q4_K: 4.625 / 8, Q.Q6_K: 6.5625 / 8, Q.Q5_0: 1.125}[tensor_type]
    assert packed_bytes == OUT * IN * bytes_per_weight
    unpack = {
        Q.Q4_K: kquant_packing.dequantize_q4k,
        Q.Q6_K: kquant_packing.dequantize_q6k,
        Q.Q5_0: lambda packed, out, in_: vnni_kernels.dequantize(packed, out, in_, 8),
    }[tensor_type]
    expected = dequantize(raw, tensor_type, (OUT, IN))
    got = unpack(segment.packed, OUT, IN)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))  # -0.0 and +0.0 told apart too


@pytest.mark.parametrize("variant", VARIANTS)
def test_q4_k_gives_the_q4_kernels_bits_where_its_scales_are_float16_values(variant) -> None:
    g = torch.Generator().manual_seed(5)
    q = torch.randint(0, 16, (OUT, IN), generator=g, dtype=torch.uint8)
    sc, m = (torch.randint(0, 64, (OUT, IN // 32), generator=g, dtype=torch.uint8) for _ in range(2))
    d = torch.full((OUT, IN // 256), 2.0**-8, dtype=torch.float16)  # powers of two: d * sc is a float16
    dmin = torch.full((OUT, IN // 256), 2.0**-9, dtype=torch.float16)
    packed = kquant_packing.pack_q4k(q, sc, m, d, dmin)
    scale = d.float().repeat_interleave(8, 1) * sc.float()
    zero = -(dmin.float().repeat_interleave(8, 1) * m.float())
    q4 = vnni_kernels.pack_q4(q, scale.half(), zero.half())
    for dtype in DTYPES:
        x = _x(dtype)
        ours = vnni_kernels.blocks_mm(x, packed, IN, (FORMATS["q4_k"],), (OUT,), variant)
        assert torch.equal(ours, vnni_kernels.q4_mm(x, q4, IN, variant))


@pytest.mark.parametrize("variant", VARIANTS)
def test_q6_k_gives_the_q8_kernels_bits_where_its_products_fit_int8(variant) -> None:
    g = torch.Generator().manual_seed(6)
    q = torch.randint(0, 64, (OUT, IN), generator=g, dtype=torch.uint8)
    sc = torch.randint(-3, 4, (OUT, IN // 16), generator=g, dtype=torch.int8)  # |sc * (q - 32)| <= 96
    d = (torch.rand(OUT, IN // 256, generator=g) * 0.01).half()
    packed = kquant_packing.pack_q6k(q, sc, d)
    w = (sc.to(torch.int16).repeat_interleave(16, 1) * (q.to(torch.int16) - 32)).to(torch.int8)
    q8 = vnni_kernels.pack_q8(w, d.repeat_interleave(8, 1))
    for dtype in DTYPES:
        x = _x(dtype, seed=7)
        ours = vnni_kernels.blocks_mm(x, packed, IN, (FORMATS["q6_k"],), (OUT,), variant)
        assert torch.equal(ours, vnni_kernels.q8_mm(x, q8, IN, variant))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("tensor_type", [Q.Q4_K, Q.Q6_K, Q.Q5_0], ids=lambda t: t.name)
def test_random_blocks_multiply_the_files_weights_by_int8_activations(tensor_type, variant, dtype) -> None:
    linear, expected = _linear(tensor_type, variant, seed=8)
    x = _x(dtype, seed=9)
    y = linear(x)
    assert y.dtype == dtype and y.shape == (ROWS, OUT)
    assert_int8_product(y, x, expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_weight_of_mixed_segments_gives_each_segments_own_outputs(variant) -> None:
    raws = {t: _raw(t, seed=10 + i) for i, t in enumerate((Q.Q4_K, Q.Q6_K, Q.Q5_0))}
    parts = [_segment(t, raw, OUT) for t, raw in raws.items()]
    linear = QuantizedLinear.from_segments(parts + [parts[0]], IN, variant)  # the last Q4_K stays its own
    assert linear.formats == (2, 3, 1, 2) and linear.outs == (OUT,) * 4 and linear.bits == 8
    x = _x(torch.float32, seed=11, rows=3)
    together = linear(x)
    alone = [vnni_kernels.blocks_mm(x, p.packed, IN, (p.format_code,), (OUT,), variant) for p in parts + [parts[0]]]
    assert torch.equal(together, torch.cat(alone, dim=1))
    expected = [dequantize(raw, t, (OUT, IN)) for t, raw in raws.items()]
    assert torch.equal(linear.dequantize(), torch.cat([*expected, expected[0]]))
    for i in range(3):  # a row's result alone as in the batch
        assert torch.equal(linear(x[i : i + 1]), together[i : i + 1])


def test_adjacent_segments_of_one_format_become_one() -> None:
    if not RUNNABLE:
        pytest.skip("no variant of minipd's kernels runs here")
    a, b = (_segment(Q.Q4_K, _raw(Q.Q4_K, seed=s), OUT) for s in (12, 13))
    linear = QuantizedLinear.from_segments([a, b], IN, RUNNABLE[0])
    assert linear.formats == (2,) and linear.outs == (2 * OUT,) and linear.packed.shape == (4, a.packed.shape[1])


@pytest.mark.skipif(len(RUNNABLE) < 2, reason=f"only {RUNNABLE} of {list(vnni_kernels.VARIANTS)} runs on this CPU")
@pytest.mark.parametrize("tensor_type", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_every_variant_gives_the_same_bits(tensor_type) -> None:
    for dtype in DTYPES:
        x = _x(dtype, seed=14)
        results = [_linear(tensor_type, v, seed=15)[0](x) for v in RUNNABLE]
        assert all(torch.equal(results[0], other) for other in results[1:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_segments_are_refused_and_the_op_keeps_serving(variant) -> None:
    linear, _ = _linear(Q.Q6_K, variant)
    x = _x(torch.float32, rows=2)
    before = linear(x)
    for formats, outs, in_features, match in (
        ((3,), (OUT - 16,), IN, "hold"),
        ((3,), (OUT,), IN - 256, "bytes|inputs"),
        ((2,), (OUT,), IN, "hold"),
        ((9,), (OUT,), IN, "unknown"),
        ((3,), (OUT - 8,), IN, "multiple of 16"),
        ((3, 3), (OUT,), IN, "as long"),
    ):
        with pytest.raises(RuntimeError, match=match):
            vnni_kernels.blocks_mm(x[:, :in_features], linear.packed, in_features, formats, outs, variant)
    with pytest.raises(ValueError, match="must be packed as"):
        QuantizedLinear.from_segments([Segment(FORMATS["q6_k"], linear.packed, OUT)], IN - 256, variant)
    assert torch.equal(linear(x), before)
