"""A llama GGUF whose matrices are K-quants (Q4_K, Q5_K, Q6_K, as a Q4_K_M file mixes them)
loads dense by dequantizing them: each reads back as the gguf package's reference dequantization
of its blocks (Q/K permutation undone), the model's logits equal those of the same model built
from the reference-dequantized weights; the engine serves it so end to end (prefill and decode;
kept as stored and decoded by the fused step: test_qwen2_kquant_decode.py); a file of types no kernel reads is
refused quantized, saying why; and where weights are kept quantized the ones no kernel reads
(Q5_K) are dequantized beside them, with a warning naming them."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest
import torch
from engine_helpers import complete, greedy, reference_greedy
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as reference_dequantize
from gguf_blocks import quantize
from gguf_helpers import GGUF_LAYER_NAMES, TINY, hf_weights, write_llama_gguf

from minipd.models.arch.llama import LlamaForCausalLM
from minipd.models.gguf.dequantized_log import summarize
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.gguf.gguf_loader import config_from_gguf, load_gguf_model
from minipd.models.kernels import vnni_kernels

Q = GGMLQuantizationType
# K-quants need rows of a multiple of 256 values: every matrix's input width is 256 or 512.
K_TINY = msgspec.structs.replace(TINY, hidden_size=256, intermediate_size=512, num_heads=4, head_dim=64)
# Q4_K_M's mix: Q4_K, with Q6_K for v, down and the output (llama.cpp's `use_more_bits` layers)
Q4_K_M = {
    **{f"blk.{i}.attn_v.weight": Q.Q6_K for i in range(K_TINY.num_layers)},
    **{f"blk.{i}.ffn_down.weight": Q.Q6_K for i in range(K_TINY.num_layers)},
    "output.weight": Q.Q6_K,
}
MAX_QUANT_ERROR = {Q.Q4_K: 0.06, Q.Q5_K: 0.03, Q.Q6_K: 0.015}
PROMPT = [5, 9, 17, 3, 40, 41, 90, 2, 33, 60, 61, 7]


def stored_values(weights: dict[str, torch.Tensor], types: dict[str, GGMLQuantizationType]) -> dict[str, torch.Tensor]:
    """HF-named weights as the file holds them, by the gguf package's reference dequantizer. llama.cpp
    permutes whole Q/K rows and blocks run along rows, so quantizing the unpermuted rows gives the
    blocks the file holds, reordered."""
    out = {}
    for name, values in weights.items():
        kind = types.get(name, Q.F32)
        out[name] = values if kind == Q.F32 else torch.from_numpy(reference_dequantize(quantize(values, kind), kind))
    return out


def hf_types(config, default: GGMLQuantizationType, overrides: dict[str, GGMLQuantizationType]):
    """Each matrix's type by HF name (norms stay F32), from GGUF-named overrides."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight"}
    for i in range(config.num_layers):
        names.update({f"model.layers.{i}.{hf}": f"blk.{i}.{gg}" for hf, gg in GGUF_LAYER_NAMES.items()})
    return {hf: overrides.get(gg, default) for hf, gg in names.items() if "norm" not in hf and "bias" not in hf}


def reference_model(config, values: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    model = LlamaForCausalLM(config, initialize=False)
    model.load_state_dict(values, strict=True)
    return model.eval()


@pytest.mark.parametrize("tensor_type", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_every_k_quant_reads_back_as_the_reference_dequantizes_it(tmp_path: Path, tensor_type) -> None:
    weights = hf_weights(K_TINY)
    model = load_gguf_model(write_llama_gguf(tmp_path / "k.gguf", K_TINY, weights, tensor_type))
    expected = stored_values(weights, hf_types(K_TINY, tensor_type, {}))
    loaded = model.state_dict()
    worst = 0.0
    for name, values in expected.items():
        assert torch.equal(loaded[name], values), name
        worst = max(worst, (loaded[name] - weights[name]).abs().max().item())
    assert 0 < worst <= MAX_QUANT_ERROR[tensor_type]


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A Q4_K_M-like file and the reference-dequantized weights it holds."""
    weights = hf_weights(K_TINY, seed=11)
    path = write_llama_gguf(tmp_path_factory.mktemp("k") / "q4_k_m.gguf", K_TINY, weights, Q.Q4_K, tensor_types=Q4_K_M)
    return path, stored_values(weights, hf_types(K_TINY, Q.Q4_K, Q4_K_M))


def test_logits_equal_the_model_dequantized_up_front(q4_k_m, caplog) -> None:
    path, values = q4_k_m
    with caplog.at_level(logging.INFO, logger="minipd.models.gguf.dequantized_log"):
        ours = load_gguf_model(path)
    expected = reference_model(config_from_gguf(read_gguf(path)), values)
    ids = torch.tensor(PROMPT)
    assert torch.equal(ours.forward_reference(ids), expected.forward_reference(ids))
    (record,) = caplog.records
    assert record.levelno == logging.INFO  # dense as asked: minipd's kernels read both types
    assert "15 of 15 weight matrices dequantized to float32 (weights dense)" in record.message
    assert record.message.endswith(
        "Q4_K: attn_q, attn_k, attn_output, ffn_gate, ffn_up (blk 0-1) | Q6_K: attn_v, ffn_down (blk 0-1); output"
    )


@pytest.mark.skipif(vnni_kernels.best() is None, reason="minipd's int8 kernels do not run here")
def test_keeping_unread_types_quantized_is_refused_saying_why(tmp_path: Path) -> None:
    path = write_llama_gguf(tmp_path / "q5_k.gguf", K_TINY, hf_weights(K_TINY), Q.Q5_K)
    with pytest.raises(ValueError, match="weights: quantized: .* has no Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K tensors"):
        load_gguf_model(path, weights="quantized")


def test_the_engine_serves_it_end_to_end(q4_k_m, make_engine, loop_thread) -> None:
    path, _ = q4_k_m
    # dequantized (kept as stored and decoded by the fused step: test_qwen2_kquant_decode.py)
    engine = make_engine(model=str(path), dtype="float32", weights="dense", num_blocks=16, max_model_len=128)
    assert engine.model.weights_format == "dense"
    result = loop_thread.run(complete(engine, PROMPT, greedy(8)))
    assert result.token_ids == reference_greedy(engine, PROMPT, 8)
    assert len(set(result.token_ids)) > 1, "a random model that repeats one token would hide a wrong step"


@pytest.mark.skipif(vnni_kernels.best() is None, reason="minipd's int8 kernels do not run here")
def test_kept_4_bit_weights_sit_beside_dequantized_k_quants(tmp_path: Path, caplog) -> None:
    types = {f"blk.{i}.{x}.weight": Q.Q4_0 for i in range(K_TINY.num_layers) for x in ("ffn_gate", "ffn_up")}
    types["blk.1.ffn_down.weight"] = Q.Q5_K  # no kernel reads Q5_K: dequantized
    weights = hf_weights(K_TINY, seed=4)
    path = write_llama_gguf(tmp_path / "mix.gguf", K_TINY, weights, Q.Q5_K, tensor_types=types)
    with caplog.at_level(logging.WARNING, logger="minipd.models.gguf.dequantized_log"):
        model = load_gguf_model(path, weights="quantized")
    assert model.weights_format == "quantized"
    loaded = model.state_dict()
    assert not any("gate_proj" in name or "up_proj" in name for name in loaded)  # served from their blocks
    expected = stored_values(weights, hf_types(K_TINY, Q.Q5_K, types))
    for name in ("model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"):
        assert torch.equal(loaded[name], expected[name]), name
    (record,) = caplog.records
    assert "weight matrices dequantized" in record.message and "ffn_gate" not in record.message
    assert "Q5_K: " in record.message and "ffn_down (blk 0-1)" in record.message
    dense = reference_model(model.config, expected)
    ids = torch.tensor(PROMPT)
    # only the 4-bit MLP inputs' int8 rounding sets the two apart
    assert (model.forward_reference(ids) - dense.forward_reference(ids)).abs().max().item() < 0.1


def test_the_summary_groups_roles_and_layers() -> None:
    class Info:
        def __init__(self, name: str, type_name: str):
            self.name, self.type_name = name, type_name

    infos = [Info(f"blk.{i}.attn_q.weight", "Q4_K") for i in (0, 1, 2, 5, 7, 8)]
    infos += [Info("blk.3.ffn_down.weight", "Q6_K"), Info("output.weight", "Q6_K")]
    assert summarize(infos) == "Q4_K: attn_q (blk 0-2, 5, 7-8) | Q6_K: ffn_down (blk 3); output"
