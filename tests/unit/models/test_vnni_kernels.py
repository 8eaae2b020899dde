"""minipd's int8 kernels (models/kernels/vnni_kernels.cpp, each variant that runs on this CPU: "vnni",
"avx2") against a float64 model of what they promise: the activations rounded to int8 per block
of 32, the file's weights exactly, each output within one bfloat16 step of that (float32
activations: float32 summation only); a row's result the same alone, in any batch and with any
threads, and the same from every variant; packing that round-trips to GGUF's own dequantization;
and bad input refused with the op still serving. A variant whose instructions this CPU lacks is
skipped, saying which. The build itself (g++, tens of seconds) is tested in
tests/processes/test_kernel_build.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from int8_reference import assert_int8_product

from minipd.models.kernels import vnni_kernels
from minipd.models.weights import prepacked_linear
from minipd.models.weights.quantized_linear import QuantizedLinear, RowSplit, choose_kernel

VARIANTS = [
    pytest.param(v, marks=pytest.mark.skipif(bool(why), reason=f"no {v} kernels here: {why}"))
    for v, why in ((v, vnni_kernels.unavailable(v)) for v in vnni_kernels.VARIANTS)
]
RUNNABLE = [v for v in vnni_kernels.VARIANTS if vnni_kernels.unavailable(v) is None]
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no variant of minipd's int8 kernels runs on this CPU")
DTYPES = [torch.bfloat16, torch.float32]

Q = GGMLQuantizationType
BLOCK = vnni_kernels.BLOCK
ROWS, OUT, IN = 11, 48, 4 * BLOCK  # 11 rows: a full pass of 8 and a partial one


def _blocks(tensor_type, out: int = OUT, in_: int = IN, seed: int = 0):
    """Real GGUF blocks of random weights: (q, d, m) as stored, and GGUF's float32 dequantization."""
    weight = (torch.randn(out, in_, generator=torch.Generator().manual_seed(seed)) * 0.1).numpy()
    raw = quantize(weight, tensor_type)
    expected = torch.from_numpy(dequantize(raw, tensor_type).reshape(out, in_))
    blocks = raw.reshape(out, in_ // BLOCK, -1)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
    if tensor_type == Q.Q8_0:
        return torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).reshape(out, in_), d, None, expected
    header = 4 if tensor_type == Q.Q4_1 else 2
    nibbles = torch.from_numpy(blocks[..., header:].copy())
    q = torch.cat([nibbles & 0xF, nibbles >> 4], -1).reshape(out, in_)
    m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]) if header == 4 else -8 * d
    return q, d, m, expected


def _linear(tensor_type, variant: str, **kwargs) -> tuple[QuantizedLinear, torch.Tensor]:
    q, d, m, expected = _blocks(tensor_type, **kwargs)
    if tensor_type == Q.Q8_0:
        return QuantizedLinear.from_q8(q, d.float(), kernel=variant), expected
    return QuantizedLinear.from_q4(q, d.float(), m.float() + 8 * d.float(), kernel=variant), expected


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("tensor_type", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def test_the_kernel_multiplies_the_files_weights_by_int8_activations(tensor_type, variant, dtype) -> None:
    linear, expected = _linear(tensor_type, variant)
    assert torch.equal(linear.dequantize(), expected)  # packing keeps GGUF's own values
    x = torch.randn(ROWS, IN, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = linear(x)
    assert y.dtype == dtype and y.shape == (ROWS, OUT)
    assert_int8_product(y, x, expected)  # within one bfloat16 step of the int8 model, plus float32 summation


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("tensor_type", [Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def test_a_rows_result_does_not_depend_on_its_batch_or_the_threads(tensor_type, variant, dtype) -> None:
    linear, _ = _linear(tensor_type, variant, out=64, in_=6 * BLOCK)
    x = torch.randn(19, 6 * BLOCK, generator=torch.Generator().manual_seed(2)).to(dtype)
    together = linear(x)
    for i in range(x.shape[0]):
        assert torch.equal(linear(x[i : i + 1]), together[i : i + 1])
    assert torch.equal(linear(x[5:13]), together[5:13])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(linear(x), together)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(len(RUNNABLE) < 2, reason=f"only {RUNNABLE} of {list(vnni_kernels.VARIANTS)} runs on this CPU")
@pytest.mark.parametrize("tensor_type", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def test_every_variant_gives_the_same_bits(tensor_type) -> None:
    x = torch.randn(ROWS, IN, generator=torch.Generator().manual_seed(4))
    for dtype in DTYPES:
        results = [_linear(tensor_type, v)[0](x.to(dtype)) for v in RUNNABLE]
        assert all(torch.equal(results[0], other) for other in results[1:])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_mixed_dense_copy_holds_the_files_weights_in_the_models_dtype(variant, dtype) -> None:
    q, d, m, expected = _blocks(Q.Q4_1)
    linear = QuantizedLinear.from_q4(
        q, d.float(), m.float() + 8 * d.float(), keep_dense=True, kernel=variant, dense_dtype=dtype
    )
    weight = expected.to(dtype)  # what loading the file dense in that dtype gives
    x = torch.randn(ROWS, IN, generator=torch.Generator().manual_seed(3)).to(dtype)
    through_copy = linear(x, RowSplit.of([(0, ROWS)], ROWS))
    assert linear.has_dense and linear.dense_nbytes == OUT * IN * weight.element_size()
    assert torch.equal(through_copy, prepacked_linear.linear(x, weight, None, prepacked_linear.prepack(weight)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_input_is_refused_and_the_op_keeps_serving(variant) -> None:
    linear, _ = _linear(Q.Q4_1, variant)
    good = torch.ones(2, IN, dtype=torch.bfloat16)
    before = linear(good)
    for bad, match in (
        (torch.ones(2, IN, dtype=torch.float16), "does not take torch.float16"),
        (torch.ones(2, IN + BLOCK, dtype=torch.bfloat16), "bfloat16 or float32 CPU tensor"),
        (torch.ones(IN, dtype=torch.bfloat16), "bfloat16 or float32 CPU tensor"),
    ):
        with pytest.raises((RuntimeError, TypeError), match=match):
            linear(bad)
    with pytest.raises(RuntimeError, match="packed weights"):
        vnni_kernels.q4_mm(good, linear.packed[:, :-1].contiguous(), IN, variant)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        vnni_kernels.q8_mm(good, linear.packed, IN - 1, variant)
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        vnni_kernels.q4_mm(good.half(), linear.packed, IN, variant)
    with pytest.raises(ValueError, match="multiples of 16"):
        vnni_kernels.pack_q4(torch.zeros(8, IN, dtype=torch.uint8), torch.ones(8, 4).half(), torch.ones(8, 4).half())
    with pytest.raises(ValueError, match="float16"):  # a scale GGUF could not have stored
        QuantizedLinear.from_q4(
            torch.zeros(16, 32, dtype=torch.uint8), torch.full((16, 1), 0.1), torch.zeros(16, 1), kernel=variant
        )
    assert torch.equal(linear(good), before)
    assert linear(torch.empty(0, IN, dtype=torch.bfloat16)).shape == (0, OUT)


def test_choose_kernel_takes_the_fastest_that_runs_and_falls_back_only_for_auto(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert choose_kernel("auto") == RUNNABLE[0] and choose_kernel("torch") == "torch"
    for variant in RUNNABLE:
        assert choose_kernel(variant) == variant
    why = {"vnni": "this CPU lacks avx512_vnni", "avx2": None}
    monkeypatch.setattr(vnni_kernels, "_load", lambda variant: why[variant])
    assert choose_kernel("auto") == "avx2" and vnni_kernels.best() == "avx2"
    with pytest.raises(ValueError, match="vnni: this CPU lacks avx512_vnni"):
        choose_kernel("vnni")
    why["avx2"] = "this CPU lacks avx2"
    assert choose_kernel("auto") == "torch" and vnni_kernels.best() is None
    with pytest.raises(ValueError, match="unknown 'int4'"):
        choose_kernel("int4")
