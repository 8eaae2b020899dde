"""A qwen2 GGUF (q/k/v biases, untied output, rope base from `qwen2.rope.freq_base`) written from
a tiny random transformers Qwen2ForCausalLM loads into minipd with the logits transformers gets
from the same file and from the checkpoint it came from, and the same greedy tokens; with its
matrices in Q4_K/Q6_K its logits equal those of the reference-dequantized weights; the engine
serves it; and its 4-bit projections, q/k/v included, are kept quantized with q/k/v's biases
dense (fused decode through K-quants: test_qwen2_kquant_decode.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import complete, greedy, reference_greedy
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as reference_dequantize
from gguf_blocks import quantize
from gguf_parity import from_gguf, max_diff, prompts
from qwen2_gguf import hf_qwen2, trained_vocab, write_qwen2_gguf

from minipd.models.arch.llama import LlamaForCausalLM
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.gguf.gguf_loader import config_from_gguf, hf_name, load_gguf_model
from minipd.models.kernels import vnni_kernels

Q = GGMLQuantizationType
FP32_TOLERANCE = 1e-4
# Q4_K_M's mix on the tiny model: Q4_K, Q6_K for v, down and the output.
Q4_K_M = {
    **{f"blk.{i}.{x}.weight": Q.Q6_K for i in range(2) for x in ("attn_v", "ffn_down")},
    "output.weight": Q.Q6_K,
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(the HF model, its F32 GGUF, its Q4_K_M-like GGUF), each file in a folder of its own."""
    vocab = trained_vocab("qwen2")
    hf = hf_qwen2(len(vocab.tokens), seed=2)
    f32 = write_qwen2_gguf(tmp_path_factory.mktemp("f32") / "qwen2.gguf", hf, vocab)
    k = write_qwen2_gguf(tmp_path_factory.mktemp("k") / "qwen2.gguf", hf, vocab, Q.Q4_K, tensor_types=Q4_K_M)
    return hf, f32, k


def test_the_config_comes_from_the_qwen2_metadata(checkpoint) -> None:
    hf, f32, _ = checkpoint
    config = config_from_gguf(read_gguf(f32))
    assert config.architecture == "Qwen2ForCausalLM" and config.attention_bias
    assert (config.rope_theta, config.tie_word_embeddings) == (1000000.0, False)
    assert (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim) == (256, 4, 2, 64)
    assert config.vocab_size == hf.config.vocab_size


def test_logits_match_transformers_from_the_file_and_the_checkpoint(checkpoint) -> None:
    hf, f32, _ = checkpoint
    ours = load_gguf_model(f32)
    vocab_size = hf.config.vocab_size
    assert max_diff(ours, from_gguf(f32), vocab_size) <= FP32_TOLERANCE
    assert max_diff(ours, hf, vocab_size) <= FP32_TOLERANCE
    # the biases matter: without them the logits move far past the tolerance
    ids = prompts(vocab_size)[2]
    logits = ours.forward_reference(ids)
    with torch.no_grad():
        for layer in ours.model.layers:
            layer.self_attn.qkv_bias.zero_()
    assert (ours.forward_reference(ids) - logits).abs().max().item() > 100 * FP32_TOLERANCE


def test_greedy_tokens_equal_transformers(checkpoint, make_engine, loop_thread) -> None:
    hf, f32, _ = checkpoint
    engine = make_engine(model=str(f32), dtype="float32", num_blocks=32, max_model_len=128)
    prompt = engine.tokenizer.encode("def fibonacci(n):\n    return")
    result = loop_thread.run(complete(engine, prompt, greedy(12)))
    with torch.no_grad():
        expected = from_gguf(f32).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert result.token_ids == expected[0, len(prompt) :].tolist()
    assert result.token_ids == reference_greedy(engine, prompt, 12)
    assert len(set(result.token_ids)) > 1


def test_k_quant_logits_equal_the_dequantized_reference(checkpoint) -> None:
    hf, _, k = checkpoint
    ours = load_gguf_model(k)
    file = read_gguf(k)
    reference = LlamaForCausalLM(config_from_gguf(file), initialize=False)
    gguf_names = {hf_name(g): g for g in file.tensors}
    values = {}
    for name, tensor in hf.state_dict().items():
        kind = Q(file.tensors[gguf_names[name]].ggml_type)
        values[name] = tensor if kind == Q.F32 else torch.from_numpy(reference_dequantize(quantize(tensor, kind), kind))
    assert {Q(file.tensors[g].ggml_type) for g in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight")} == {Q.Q4_K, Q.Q6_K}
    reference.load_state_dict(values, strict=True)
    for ids in prompts(hf.config.vocab_size):
        assert torch.equal(ours.forward_reference(ids), reference.forward_reference(ids))
    assert max_diff(ours, from_gguf(k), hf.config.vocab_size) <= FP32_TOLERANCE


def test_bfloat16_strays_from_float32_no_more_than_transformers_in_bfloat16(checkpoint) -> None:
    hf, f32, _ = checkpoint
    ours = load_gguf_model(f32, dtype=torch.bfloat16)
    theirs = from_gguf(f32).to(torch.bfloat16)
    ours_off = max_diff(ours, hf, hf.config.vocab_size)
    theirs_off = max_diff(theirs, hf, hf.config.vocab_size)  # 0.91 on logits up to ~9 when written
    assert 0 < ours_off <= 1.5 * theirs_off


@pytest.mark.skipif(vnni_kernels.best() is None, reason="minipd's int8 kernels do not run here")
def test_4_bit_projections_are_kept_with_dense_qkv_biases(tmp_path: Path) -> None:
    vocab = trained_vocab("qwen2")
    hf = hf_qwen2(len(vocab.tokens), seed=5)
    path = write_qwen2_gguf(tmp_path / "q4.gguf", hf, vocab, Q.Q4_0)
    quantized = load_gguf_model(path, weights="quantized")
    assert quantized.weights_format == "quantized"
    for layer in quantized.model.layers:
        assert layer.self_attn.quant_qkv is not None and layer.self_attn.quant_o is not None
        assert layer.mlp.quant_gate_up is not None and layer.mlp.quant_down is not None
    assert "model.layers.0.self_attn.q_proj.bias" in quantized.state_dict()
    dense = load_gguf_model(path)
    ids = prompts(hf.config.vocab_size)[2]
    gap = (quantized.forward_reference(ids) - dense.forward_reference(ids)).abs().max().item()
    assert 0 < gap < 0.5  # only the int8 rounding of the 4-bit projections' inputs
    with torch.no_grad():  # the biases are added to the quantized q/k/v: without them the logits move far
        for layer in quantized.model.layers:
            layer.self_attn.qkv_bias.zero_()
    assert (quantized.forward_reference(ids) - dense.forward_reference(ids)).abs().max().item() > 2 * gap
