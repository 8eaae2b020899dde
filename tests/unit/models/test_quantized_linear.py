"""4-bit GGUF weights served as stored: Q4_0/Q4_1 blocks decode to exactly GGUF's own float32
dequantization, the int4 kernel multiplies those weights with only its bfloat16 scales
rounded, a tiny model loaded quantized matches the same file loaded dense, and what cannot be
served quantized is refused or left dense by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from gguf_helpers import TINY, hf_weights, write_llama_gguf

from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.gguf.gguf_loader import load_gguf_model
from minipd.models.gguf.gguf_quantized import q4_values
from minipd.models.kernels import vnni_kernels
from minipd.models.kernels.kquant_packing import FORMATS
from minipd.models.weights.quantized_linear import GROUP_SIZE, QuantizedLinear, kernel_available

Q = GGMLQuantizationType
Q4 = [Q.Q4_0, Q.Q4_1]
# Largest |logit difference| of the tiny model, quantized vs dense bf16 (measured with torch's
# kernel: 0.051 Q4_0, 0.055 Q4_1; with the int8 kernels, whose activations are rounded to int8
# too: 0.112 Q4_0 on an AVX2 CPU; logits up to ~3.6); a wrong row order, group or nibble moves
# them by far more (1+).
TINY_LOGITS_TOLERANCE = 0.2


def _gguf_file(tmp_path: Path, tensor_type, **kwargs):
    return read_gguf(write_llama_gguf(tmp_path / "tiny.gguf", TINY, hf_weights(TINY), tensor_type, **kwargs))


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


@pytest.mark.parametrize("tensor_type", Q4, ids=lambda t: t.name)
def test_q4_blocks_decode_to_gguf_dequantization_bit_for_bit(tmp_path: Path, tensor_type) -> None:
    file = _gguf_file(tmp_path, tensor_type)
    info = file.tensors["blk.0.ffn_gate.weight"]
    q, scale, zero = q4_values(file, info)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15
    expected = torch.from_numpy(dequantize(np.asarray(file.tensor_bytes(info)), tensor_type).reshape(info.shape))
    values = (q.float() - 8) * scale.repeat_interleave(GROUP_SIZE, 1) + zero.repeat_interleave(GROUP_SIZE, 1)
    assert torch.equal(values, expected)
    assert (tensor_type == Q.Q4_0) == bool((zero == 0).all())


@pytest.mark.parametrize("tensor_type", Q4, ids=lambda t: t.name)
def test_kernel_multiplies_the_blocks_with_only_the_scales_rounded_to_bf16(tensor_type) -> None:
    gen = torch.Generator().manual_seed(0)
    rows, cols = 48, 4 * GROUP_SIZE
    weight = (torch.randn(rows, cols, generator=gen) * 0.1).numpy()
    stored = dequantize(quantize(weight, tensor_type), tensor_type)
    blocks = quantize(weight, tensor_type).reshape(rows, cols // GROUP_SIZE, -1)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0]).float()
    header = 4 if tensor_type == Q.Q4_1 else 2
    nibbles = torch.from_numpy(blocks[..., header:].copy())
    q = torch.cat([nibbles & 0xF, nibbles >> 4], -1).reshape(rows, cols)
    if header == 4:  # Q4_1: w = d * q + m
        zero = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]).float() + 8 * d
    else:  # Q4_0: w = d * (q - 8)
        zero = torch.zeros_like(d)
    linear = QuantizedLinear.from_q4(q, d, zero)
    kernel_weights = linear.dequantize()
    groups = lambda t: t.repeat_interleave(GROUP_SIZE, 1)  # noqa: E731
    assert torch.equal(kernel_weights, (q.float() - 8) * groups(_bf16(d)) + groups(_bf16(zero)))
    # bf16 keeps 8 significant bits: each weight moves by at most half a step of its scale
    # (times |q - 8| <= 8) plus half a step of its zero.
    bound = groups(8 * d.abs() + zero.abs()) * 2.0**-8
    assert ((kernel_weights - torch.from_numpy(stored)).abs() <= bound).all()
    x = torch.randn(5, cols, generator=gen).to(torch.bfloat16)
    torch.testing.assert_close(linear(x).float(), x.float() @ kernel_weights.t(), rtol=1e-2, atol=1e-2)


def test_bad_shapes_and_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="groups of 32"):
        QuantizedLinear.from_q4(torch.zeros(16, 40, dtype=torch.uint8), torch.ones(16, 1), torch.zeros(16, 1))
    with pytest.raises(ValueError, match="multiple of 16"):
        QuantizedLinear.from_q4(torch.zeros(8, 32, dtype=torch.uint8), torch.ones(8, 1), torch.zeros(8, 1))
    assert not QuantizedLinear.supports(8, 32) and QuantizedLinear.supports(16, 64)
    linear = QuantizedLinear.from_q4(torch.zeros(16, 32, dtype=torch.uint8), torch.ones(16, 1), torch.zeros(16, 1))
    with pytest.raises(TypeError, match="the torch kernel does not take torch.float32 inputs"):
        linear(torch.zeros(1, 32))


@pytest.mark.parametrize("tensor_type", Q4, ids=lambda t: t.name)
def test_a_model_loaded_quantized_matches_the_same_file_loaded_dense(tmp_path: Path, tensor_type) -> None:
    path = write_llama_gguf(tmp_path / "tiny.gguf", TINY, hf_weights(TINY), tensor_type)
    quantized = load_gguf_model(path, dtype=torch.bfloat16, weights="quantized")
    dense = load_gguf_model(path, dtype=torch.bfloat16)
    assert (quantized.weights_format, dense.weights_format) == ("quantized", "dense")
    names = set(quantized.state_dict())
    assert {"model.layers.0.self_attn.quant_qkv.packed", "quant_lm_head.packed"} <= names
    assert not any(n.endswith(("q_proj.weight", "up_proj.weight", "down_proj.weight", "lm_head.weight")) for n in names)
    ids = torch.tensor([1, 5, 9, 40, 7, 7, 3, 60, 2, 11])
    ours, theirs = quantized.forward_reference(ids), dense.forward_reference(ids)
    assert (ours - theirs).abs().max().item() <= TINY_LOGITS_TOLERANCE
    assert not torch.equal(ours, theirs), "the quantized model must not have run the dense weights"


@pytest.mark.skipif(not kernel_available(), reason="this torch has no int4 kernel")
def test_a_fused_group_with_a_part_not_in_4_bits_stays_dense_for_torchs_kernel(tmp_path: Path) -> None:
    file = _gguf_file(tmp_path, Q.Q4_1, tensor_types={"blk.0.attn_v.weight": Q.Q8_0})
    model = load_gguf_model(file.path, dtype=torch.bfloat16, weights="quantized", quantized_kernel="torch")
    attn0, attn1 = model.model.layers[0].self_attn, model.model.layers[1].self_attn
    assert attn0.quant_qkv is None and attn0.qkv_weight is not None and attn0.quant_o is not None
    assert attn1.quant_qkv is not None


@pytest.mark.skipif(vnni_kernels.best() is None, reason="minipd's int8 kernels do not run here")
def test_a_fused_group_with_a_q8_0_part_is_served_in_segments_by_minipds_kernels(tmp_path: Path) -> None:
    file = _gguf_file(tmp_path, Q.Q4_1, tensor_types={"blk.0.attn_v.weight": Q.Q8_0})
    model = load_gguf_model(file.path, dtype=torch.float32, weights="quantized")
    qkv = model.model.layers[0].self_attn.quant_qkv
    assert qkv is not None and qkv.formats == (FORMATS["q4"], FORMATS["q8"])
    dense = load_gguf_model(file.path, dtype=torch.float32).model.layers[0].self_attn.qkv_weight
    assert torch.equal(qkv.dequantize(), dense)


def test_quantized_weights_are_refused_where_they_cannot_be_served(tmp_path: Path) -> None:
    q4_path = _gguf_file(tmp_path, Q.Q4_1).path
    with pytest.raises(ValueError, match="torch's int4 kernel takes bfloat16 only"):
        load_gguf_model(q4_path, dtype=torch.float32, weights="quantized", quantized_kernel="torch")
    with pytest.raises(ValueError, match="bfloat16 or float32, only"):
        load_gguf_model(q4_path, dtype=torch.float16, weights="quantized")
    float_path = write_llama_gguf(tmp_path / "f32.gguf", TINY, hf_weights(TINY), Q.F32)
    with pytest.raises(ValueError, match="no Q4_0/Q4_1(/Q5_0/Q8_0/Q4_K/Q6_K)? tensors"):
        load_gguf_model(float_path, dtype=torch.bfloat16, weights="quantized")
    with pytest.raises(ValueError, match="unknown 'int4'"):
        load_gguf_model(q4_path, dtype=torch.bfloat16, weights="int4")
