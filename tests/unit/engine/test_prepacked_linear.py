"""bf16 linear weights packed for oneDNN compute what F.linear computes, and the loader packs them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minipd.engine.model_loader import load_model
from minipd.models.weights import prepacked_linear

requires_packing = pytest.mark.skipif(
    not prepacked_linear.can_prepack(torch.empty(2, 2, dtype=torch.bfloat16)),
    reason="this torch/CPU has no oneDNN bf16 packed linear",
)


@requires_packing
@pytest.mark.parametrize("rows", [1, 8, 64, 300])
def test_packed_linear_matches_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(960, 576, generator=gen).bfloat16()
    bias = torch.randn(960, generator=gen).bfloat16()
    x = torch.randn(rows, 576, generator=gen).bfloat16()
    packed = prepacked_linear.prepack(weight)
    assert packed is not None
    ours = prepacked_linear.linear(x, weight, bias, packed)
    assert ours.dtype == torch.bfloat16 and ours.shape == (rows, 960)
    torch.testing.assert_close(ours, F.linear(x, weight, bias), atol=2e-2, rtol=1e-2)


def test_float32_and_non_cpu_weights_are_left_alone():
    assert prepacked_linear.prepack(torch.randn(4, 4)) is None
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    assert torch.equal(prepacked_linear.linear(x, w, None, None), F.linear(x, w))


@requires_packing
def test_the_loader_packs_bf16_models_and_their_logits_match_the_plain_path():
    model, _ = load_model("tiny", torch.device("cpu"), torch.bfloat16)
    assert model.packed_lm_head is not None
    assert all(
        layer.mlp.packed_gate_up is not None and layer.self_attn.packed_qkv is not None for layer in model.model.layers
    )
    ids = torch.arange(40) % 250
    packed_logits = model.forward_reference(ids)
    for layer in model.model.layers:  # the same model on F.linear
        layer.self_attn.packed_qkv = layer.self_attn.packed_o = None
        layer.mlp.packed_gate_up = layer.mlp.packed_down = None
    model.packed_lm_head = None
    plain_logits = model.forward_reference(ids)
    torch.testing.assert_close(packed_logits, plain_logits, atol=5e-2, rtol=5e-2)
    assert (packed_logits.argmax(-1) == plain_logits.argmax(-1)).float().mean() >= 0.95
    fp32, _ = load_model("tiny", torch.device("cpu"), torch.float32)
    assert fp32.packed_lm_head is None
