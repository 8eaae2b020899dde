"""The "mixed" weights format: each 4-bit projection keeps a dense bf16 copy of exactly the
weights the int4 kernel multiplies, `RowSplit` sends whole segments of rows through it (each
segment as it would run alone), every other row still reads the 4-bit weights, and the state
dict, the weight digest and `forward_reference` stay those of the 4-bit weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_helpers import TINY, hf_weights, write_llama_gguf

from minipd.disagg.fingerprint import weights_digest
from minipd.models.gguf.gguf_loader import load_gguf_model
from minipd.models.weights.quantized_linear import GROUP_SIZE, INT8_KERNELS, QuantizedLinear, RowSplit

IN, OUT = 4 * GROUP_SIZE, 48
# SmolLM2's gate/up projection: oneDNN's bf16 row results there depend on the rows it is given
GATE_UP_OUT, GATE_UP_IN = 3072, 576


def _linear(seed: int = 0, out: int = OUT, in_: int = IN) -> QuantizedLinear:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out, in_), generator=gen, dtype=torch.uint8)
    scale = torch.rand(out, in_ // GROUP_SIZE, generator=gen) * 0.05
    zero = torch.randn(out, in_ // GROUP_SIZE, generator=gen) * 0.05
    return QuantizedLinear.from_q4(q, scale, zero, keep_dense=True)


def _inputs(rows: int, seed: int = 1, in_: int = IN) -> torch.Tensor:
    return torch.randn(rows, in_, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def test_the_dense_copy_is_the_kernels_weights_rounded_to_bfloat16() -> None:
    linear = _linear()
    assert linear.has_dense and linear.dense_nbytes == 2 * OUT * IN
    # a one-hot row picks one weight per output: no sum rounds anything but the weight itself
    copy = linear(torch.eye(IN, dtype=torch.bfloat16), RowSplit.of([(0, IN)], IN)).t()
    assert torch.equal(copy, linear.dequantize().to(torch.bfloat16))


def test_dense_rows_stay_within_bfloat16_rounding_of_the_4_bit_rows() -> None:
    linear = _linear()
    x = _inputs(64)
    dense = linear(x, RowSplit.of([(0, 64)], 64)).float()
    int4 = linear(x).float()
    # Both multiply the same weights, the copy's rounded to bf16 (<= 2^-9 relative each), and
    # both round their outputs to bf16 (<= 2^-9 relative): per output at most 3 * 2^-9 of
    # sum |x| |w|; 2^-7 leaves room for float32 accumulation order.
    scale = x.float().abs() @ linear.dequantize().abs().t()
    assert ((dense - int4).abs() <= 2.0**-7 * scale).all()
    assert not torch.equal(dense, int4), "the dense rows must have gone through the copy"


def test_row_split_covers_the_rows_not_dense_as_a_slice_where_they_are_contiguous() -> None:
    assert RowSplit.of([], 5) == ((), slice(0, 5))
    assert RowSplit.of([(2, 5)], 5) == (((2, 5),), slice(0, 2))
    assert RowSplit.of([(0, 3), (3, 5)], 5) == (((0, 3), (3, 5)), None)
    split = RowSplit.of([(2, 5)], 7)
    assert split.dense == ((2, 5),) and split.rest.tolist() == [0, 1, 5, 6]


def test_each_segment_of_a_split_step_gets_what_it_gets_alone() -> None:
    """Rows 0-2 read the 4-bit weights, 3-10 and 11-69 are dense segments, 70-79 4-bit again:
    every segment's result is bit for bit that of the segment run alone (one dense matmul over
    both segments would not give that on this shape)."""
    linear = _linear(out=GATE_UP_OUT, in_=GATE_UP_IN)
    x = _inputs(80, in_=GATE_UP_IN)
    segments = [(3, 11), (11, 70)]
    out = linear(x, RowSplit.of(segments, 80))
    for start, stop in segments:
        rows = stop - start
        alone = linear(x[start:stop].clone(), RowSplit.of([(0, rows)], rows))
        assert torch.equal(out[start:stop], alone)
    assert torch.equal(out[:3], linear(x[:3].clone())) and torch.equal(out[70:], linear(x[70:].clone()))
    assert torch.equal(linear(x, RowSplit.of([], 80)), linear(x)), "no dense segment: all 4-bit"


def test_without_a_dense_copy_a_split_still_reads_the_4_bit_weights() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (OUT, IN), generator=gen, dtype=torch.uint8)
    linear = QuantizedLinear.from_q4(q, torch.full((OUT, IN // GROUP_SIZE), 0.01), torch.zeros(OUT, IN // GROUP_SIZE))
    x = _inputs(16)
    assert not linear.has_dense and linear.dense_nbytes == 0
    assert torch.equal(linear(x, RowSplit.of([(0, 16)], 16)), linear(x))


@pytest.fixture(scope="module")
def q4_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "tiny.gguf"
    return write_llama_gguf(path, TINY, hf_weights(TINY), GGMLQuantizationType.Q4_1)


def test_mixed_keeps_the_4_bit_state_dict_digest_and_reference(q4_path: Path) -> None:
    mixed = load_gguf_model(q4_path, dtype=torch.bfloat16, weights="mixed")
    quantized = load_gguf_model(q4_path, dtype=torch.bfloat16, weights="quantized")
    assert (mixed.weights_format, quantized.weights_format) == ("mixed", "quantized")
    assert mixed.state_dict().keys() == quantized.state_dict().keys()
    assert weights_digest(mixed) == weights_digest(quantized)
    # every 4-bit projection (q/k/v, o, gate/up, down per layer) has its copy; so has the untied
    # LM head with torch's kernel, while minipd's (vnni, avx2) serve it from its blocks alone (it only
    # multiplies the few rows that need logits)
    h, f, qkv = TINY.hidden_size, TINY.intermediate_size, (TINY.num_heads + 2 * TINY.num_kv_heads) * TINY.head_dim
    per_layer = qkv * h + h * h + 2 * f * h + h * f
    head = 0 if mixed.quantized_kernel in INT8_KERNELS else TINY.vocab_size * h
    weights = TINY.num_layers * per_layer + head
    assert mixed.dense_copy_nbytes == 2 * weights and quantized.dense_copy_nbytes == 0
    assert "dense copy" in mixed.describe_weights() and "no dense copy" in quantized.describe_weights()
    ids = torch.tensor([1, 5, 9, 40, 7, 7, 3, 60, 2, 11])
    assert torch.equal(mixed.forward_reference(ids), quantized.forward_reference(ids))
