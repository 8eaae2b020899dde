"""A tiny qwen2 GGUF in Q4_K_M's mix (Q4_K; Q6_K for v, down and the output), and one in the 0.5B
file's legacy mix (Q5_0, Q8_0), served from their blocks by minipd's kernels and decoded through
the fused step (models/kernels/fused_decode.cpp), each variant that runs here ("avx2" forced too):

- every projection and the lm_head are kept as stored (q/k/v as segments: Q4_K, Q4_K, Q6_K), the
  q/k/v biases stay under their names, and the packed weights dequantize to the file's own values
  bit for bit (the dense float32 load of the same file);
- teacher-forced, the fused step's logits stay within the activations' int8 rounding of the
  dense float32 model's from the same file, and nearer still to the eager path's over the same
  blocks; greedy tokens agree but for near-ties; "vnni" and "avx2" give the same bits;
- the engine decodes it through the fused step, greedy, as the dense model does.

Why not bit-equal: the weights are the file's, exactly, on every path, but the kernels round the
activations to int8 per block of 32 (llama.cpp does the same), each rounding up to half a step
of max|x| / 127; through two layers of this sharp random model that moves logits (up to ~9) by
0.35 at most, 0.05 on average (measured: vnni and avx2 alike, both mixes). Where the dense
model's top two logits are nearer than twice that, the argmax may flip (2 and 3 of 48 positions
here), so agreement is bounded, not exact. Over the same blocks the fused and eager paths differ
only in float32 summation order outside the matmuls (0.06 at most).
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import complete, greedy
from gguf import GGMLQuantizationType
from qwen2_gguf import hf_qwen2, trained_vocab, write_qwen2_gguf

from minipd.models.gguf.gguf_loader import load_gguf_model
from minipd.models.kernel_steps.fused_decode import FusedDecode, unsupported
from minipd.models.kernels import vnni_kernels
from minipd.models.kernels.kquant_packing import FORMATS

Q = GGMLQuantizationType
VARIANTS = [
    pytest.param(v, marks=pytest.mark.skipif(bool(why), reason=f"no {v} kernels here: {why}"))
    for v, why in ((v, vnni_kernels.unavailable(v)) for v in vnni_kernels.VARIANTS)
]
LAYERS = range(2)
Q4_K_M = {
    **{f"blk.{i}.{x}.weight": Q.Q6_K for i in LAYERS for x in ("attn_v", "ffn_down")},
    "output.weight": Q.Q6_K,
}
LEGACY = {  # the 0.5B file's types: Q5_0 mostly, Q8_0 for v and the output
    **{f"blk.{i}.attn_v.weight": Q.Q8_0 for i in LAYERS},
    "output.weight": Q.Q8_0,
}
MIXES = {"q4_k_m": (Q.Q4_K, Q4_K_M), "q5_0": (Q.Q5_0, LEGACY)}
BLOCK = 16
POSITIONS = 48
MAX_LOGIT_DIFFERENCE, MAX_MEAN_LOGIT_DIFFERENCE = 0.5, 0.1  # against dense: measured 0.36, 0.05
MAX_EAGER_DIFFERENCE = 0.15  # against the eager path over the same blocks: measured 0.06
MIN_AGREEMENT = 0.9  # greedy tokens against dense, teacher-forced: measured 0.94-0.96


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    vocab = trained_vocab("qwen2", size=429)  # + 3 special tokens: 432 outputs, tiles of 16 for the lm_head
    assert len(vocab.tokens) % 16 == 0
    hf = hf_qwen2(len(vocab.tokens), seed=2)
    folder = tmp_path_factory.mktemp("qwen2k")
    paths = {
        name: write_qwen2_gguf(folder / f"{name}.gguf", hf, vocab, default, tensor_types=types)
        for name, (default, types) in MIXES.items()
    }
    return paths, hf.config.vocab_size


def _pool(model, blocks: int) -> torch.Tensor:
    c = model.config
    return torch.zeros(c.num_layers, blocks, 2, BLOCK, c.num_kv_heads, c.head_dim)


def _teacher_forced(step: FusedDecode, model, ids: torch.Tensor) -> torch.Tensor:
    pool = _pool(model, len(ids) // BLOCK + 1)
    table = torch.arange(pool.shape[1]).flip(0).view(1, -1)
    return torch.cat([step(ids[p : p + 1], torch.tensor([p]), table, pool) for p in range(len(ids))])


@pytest.fixture(params=[(m, v) for m in MIXES for v in vnni_kernels.VARIANTS], ids="-".join)
def served(request, files):
    """(mix, variant, the file served from its blocks by `variant`, the same file dense in float32)."""
    mix, variant = request.param
    if (why := vnni_kernels.unavailable(variant)) is not None:
        pytest.skip(f"no {variant} kernels here: {why}")
    path = files[0][mix]
    return mix, variant, load_gguf_model(path, weights="quantized", quantized_kernel=variant), load_gguf_model(path)


def test_every_projection_is_served_from_the_files_blocks(served) -> None:
    mix, _, model, dense = served
    assert unsupported(model) is None and model.weights_format == "quantized"
    state = model.state_dict()
    expected = dense.state_dict()
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if mix == "q4_k_m":
            assert attn.quant_qkv.formats == (FORMATS["q4_k"], FORMATS["q6_k"])  # q and k merged, then v
            assert mlp.quant_down.formats == (FORMATS["q6_k"],)
        else:
            assert attn.quant_qkv.formats == (FORMATS["q8"],)  # Q5_0 repacked as Q8 beside Q8_0's v
        p = f"model.layers.{i}."
        qkv = torch.cat([expected[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        assert torch.equal(attn.quant_qkv.dequantize(), qkv)
        gate_up = torch.cat([expected[p + f"mlp.{x}_proj.weight"] for x in ("gate", "up")])
        assert torch.equal(mlp.quant_gate_up.dequantize(), gate_up)
        assert torch.equal(mlp.quant_down.dequantize(), expected[p + "mlp.down_proj.weight"])
        for x in "qkv":  # the biases stay, under their names, and are the file's
            assert torch.equal(state[p + f"self_attn.{x}_proj.bias"], expected[p + f"self_attn.{x}_proj.bias"])
    assert torch.equal(model.quant_lm_head.dequantize(), expected["lm_head.weight"])


def test_fused_greedy_tokens_equal_the_dense_models(files, served) -> None:
    paths, vocab_size = files
    mix, variant, model, dense = served
    ids = torch.randint(0, vocab_size, (POSITIONS,), generator=torch.Generator().manual_seed(3))
    fused = _teacher_forced(FusedDecode(model), model, ids)
    theirs, eager = dense.forward_reference(ids), model.forward_reference(ids)
    agreement = (fused.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    assert agreement >= MIN_AGREEMENT, f"the fused step agrees with dense on {agreement:.1%} of positions"
    difference = (fused - theirs).abs()
    assert 0 < difference.max().item() <= MAX_LOGIT_DIFFERENCE and difference.mean() <= MAX_MEAN_LOGIT_DIFFERENCE
    assert (fused - eager).abs().max().item() <= MAX_EAGER_DIFFERENCE
    if variant != "avx2" and vnni_kernels.unavailable("avx2") is None:  # the AVX2 build gives the same bits
        avx2 = load_gguf_model(paths[mix], weights="quantized", quantized_kernel="avx2")
        assert torch.equal(_teacher_forced(FusedDecode(avx2), avx2, ids), fused)
    # the biases are applied: without them the step lands far away
    for layer in model.model.layers:
        layer.self_attn.qkv_bias.zero_()
    unbiased = _teacher_forced(FusedDecode(model), model, ids)
    gap = (unbiased - theirs).abs().max().item()
    assert gap > 4 * MAX_LOGIT_DIFFERENCE, gap


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_engine_decodes_it_through_the_fused_step(files, variant, make_engine, loop_thread) -> None:
    paths, vocab_size = files
    engine = make_engine(
        model=str(paths["q4_k_m"]), dtype="float32", quantized_kernel=variant, num_blocks=16, max_model_len=128
    )
    assert engine.model.weights_format == "quantized" and engine.runner.fused is not None
    prompt = [5, 9, 17, 3, 40, 41, 90, 2, 33, 60, 61, 7]
    result = loop_thread.run(complete(engine, prompt, greedy(16)))
    dense = load_gguf_model(paths["q4_k_m"])
    expected = []
    for _ in range(16):
        expected.append(int(dense.forward_reference(torch.tensor(prompt + expected))[-1].argmax()))
    assert result.token_ids == expected
    assert len(set(result.token_ids)) > 1, "a model that repeats one token would hide a wrong step"
