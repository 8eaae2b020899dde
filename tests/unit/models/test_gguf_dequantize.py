"""minipd's own GGUF decoders give the `gguf` package's reference dequantization bit for bit, for
every type the loader reads and several shapes: on random valid blocks built byte by byte (all
types, K-quants included), on the gguf package's own quantizer's output where it has one, and
on the tests' K-quant writer's; a type it has no decoder for is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as reference
from gguf_blocks import quantize, random_blocks

from minipd.models.gguf import gguf_dequantize
from minipd.models.gguf.gguf_dequantize import DEQUANTIZED_TYPES, dequantize, dequantize_blocks

Q = GGMLQuantizationType
QUANTIZED = [t for t in DEQUANTIZED_TYPES if t not in (Q.F32, Q.F16, Q.BF16)]


def assert_same_bits(ours: torch.Tensor, expected: np.ndarray) -> None:
    assert ours.dtype == torch.float32 and tuple(ours.shape) == expected.shape
    assert np.array_equal(ours.numpy().view(np.int32), expected.astype(np.float32).view(np.int32))


def test_every_type_the_issue_names_is_decoded() -> None:
    wanted = {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}
    assert wanted <= set(DEQUANTIZED_TYPES)


@pytest.mark.parametrize("tensor_type", DEQUANTIZED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows, blocks", [(1, 1), (4, 2), (33, 3), (4, 5)])
def test_random_blocks_decode_like_the_reference(tensor_type, rows: int, blocks: int) -> None:
    rng = np.random.default_rng(rows * 100 + blocks)
    block_values = GGML_QUANT_SIZES[tensor_type][0]
    cols = block_values * blocks if block_values > 1 else 32 * blocks
    raw = random_blocks(tensor_type, rows, cols, rng)
    expected = reference(raw, tensor_type).reshape(rows, cols)
    ours = dequantize(raw, tensor_type, (rows, cols))
    assert_same_bits(ours, expected)
    if tensor_type not in (Q.F32, Q.F16, Q.BF16):
        assert np.unique(expected).size >= 8, "random blocks must give varied values"


@pytest.mark.parametrize("tensor_type", QUANTIZED, ids=lambda t: t.name)
def test_quantized_weights_decode_like_the_reference(tensor_type) -> None:
    """Blocks from a quantizer (the gguf package's, or the tests' K-quant writer), as a file holds them."""
    values = (np.random.default_rng(7).normal(size=(6, 512)) * 0.1).astype(np.float32)
    raw = quantize(values, tensor_type)
    ours = dequantize(raw, tensor_type, values.shape)
    assert_same_bits(ours, reference(raw, tensor_type))
    error = np.abs(ours.numpy() - values).max()
    assert 0 < error < 0.03, "the blocks hold the values they were written from, to a few percent"


def test_chunks_do_not_change_the_result(monkeypatch) -> None:
    raw = random_blocks(Q.Q6_K, 9, 768, np.random.default_rng(1))
    whole = dequantize(raw, Q.Q6_K, (9, 768))
    monkeypatch.setattr(gguf_dequantize, "CHUNK_VALUES", 256 * 2)  # two blocks at a time, the last one alone
    assert torch.equal(dequantize(raw, Q.Q6_K, (9, 768)), whole)


def test_a_type_without_decoder_or_a_wrong_size_is_named() -> None:
    raw = np.zeros((2, GGML_QUANT_SIZES[Q.Q3_K][1]), dtype=np.uint8)
    with pytest.raises(ValueError, match="no decoder for tensor type Q3_K"):
        dequantize(raw, Q.Q3_K, (2, 256))
    with pytest.raises(ValueError, match="blocks do not hold a tensor of shape"):
        dequantize(np.zeros((2, 144), dtype=np.uint8), Q.Q4_K, (2, 512))
    with pytest.raises(ValueError, match=r"Q4_K blocks must be uint8 \[n, 144\]"):
        dequantize_blocks(np.zeros((2, 18), dtype=np.uint8), Q.Q4_K)
