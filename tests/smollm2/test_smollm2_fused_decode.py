"""The fused decode step (models/kernels/fused_decode.cpp) on SmolLM2's Q4_1 file in float32, where the
engine serves the 4-bit projections and the Q8_0 lm_head from their blocks and decodes through
it by default: teacher-forced greedy tokens and logits against the same file dequantized
(float32, dense) and against the eager path over the same blocks; the engine's tokens with and
without it; a row's logits alone and in a batch; bad indices refused with the op still serving.
(Disaggregated against colocated, in float32 through this step: test_smollm2_disagg.py.)"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import complete, greedy
from gguf_helpers import PROSE, requires_smollm2

from minipd.engine.model_loader import load_model
from minipd.models.kernel_steps.fused_decode import FusedDecode, unsupported
from minipd.models.kernels import vnni_kernels
from minipd.models.weights.block_embedding import BlockEmbedding

pytestmark = [
    requires_smollm2,
    pytest.mark.skipif(vnni_kernels.best() is None, reason="none of minipd's int8 kernels runs on this CPU"),
]

POSITIONS = 256
BLOCK = 16
MIN_AGREEMENT = 0.95
# Measured on these 256 positions (logits up to ~34): the fused step against the dense float32
# model agrees on 96.9%, largest |logit difference| 1.39, mean 0.138 (the eager path over the same
# blocks: 97.7%, 1.21, 0.146); the fused step against the eager one: 98.0%, 1.52, 0.164. The
# activations' int8 rounding is a step function: once a row's float32 rounding differs enough to
# flip one value, later layers round apart, so the two quantized paths differ from each other by
# as much as each from the dense model. The bounds leave room for other CPUs' rounding, not for a
# wrong head, position or block (differences of 10+, agreement near 0).
MAX_LOGIT_DIFFERENCE, MAX_MEAN_LOGIT_DIFFERENCE = 2.5, 0.3
DECODE_PROMPT_TOKENS, DECODE_TOKENS = 64, 64
MIN_DECODE_AGREEMENT = 0.9


@pytest.fixture(scope="module")
def models():
    cpu = torch.device("cpu")
    quantized, tokenizer = load_model("smollm2", cpu, torch.float32)  # auto: quantized in float32
    dense, _ = load_model("smollm2", cpu, torch.float32, weights="dense")
    return quantized, dense, tokenizer


def _pool(model, blocks: int) -> torch.Tensor:
    c = model.config
    return torch.zeros(c.num_layers, blocks, 2, BLOCK, c.num_kv_heads, c.head_dim)


def _teacher_forced(step: FusedDecode, model, ids: torch.Tensor) -> torch.Tensor:
    """Logits at every position, each computed as a decode row of one token over the cache."""
    pool = _pool(model, len(ids) // BLOCK + 1)
    table = torch.arange(pool.shape[1]).flip(0).view(1, -1)  # blocks out of order, as a pool hands them out
    rows = [step(ids[p : p + 1], torch.tensor([p]), table, pool) for p in range(len(ids))]
    return torch.cat(rows)


def test_float32_decodes_through_the_fused_step(models):
    quantized, dense, _ = models
    assert quantized.weights_format == "quantized" and quantized.quantized_kernel == vnni_kernels.best()
    assert unsupported(quantized) is None
    assert "float32 or bfloat16" in unsupported(load_model("tiny", torch.device("cpu"), torch.float16)[0])
    assert "blocks" in unsupported(dense)


def test_fused_greedy_tokens_and_logits_stay_near_the_dequantized_model(models):
    quantized, dense, tokenizer = models
    ids = torch.tensor(tokenizer.encode(PROSE)[:POSITIONS])
    fused = _teacher_forced(FusedDecode(quantized), quantized, ids)
    theirs, eager = dense.forward_reference(ids), quantized.forward_reference(ids)
    agreement = (fused.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    assert agreement >= MIN_AGREEMENT, f"the fused step agrees with dense on {agreement:.1%} of positions"
    difference = (fused - theirs).abs()
    assert difference.max().item() <= MAX_LOGIT_DIFFERENCE and difference.mean().item() <= MAX_MEAN_LOGIT_DIFFERENCE
    # against the eager path over the same blocks: only the rounding of its steps differs
    with_eager = (fused.argmax(-1) == eager.argmax(-1)).float().mean().item()
    assert with_eager >= MIN_AGREEMENT, f"the fused step agrees with the eager one on {with_eager:.1%}"
    apart = (fused - eager).abs()
    assert apart.max().item() <= MAX_LOGIT_DIFFERENCE and apart.mean().item() <= MAX_MEAN_LOGIT_DIFFERENCE


def test_a_bfloat16_model_decodes_through_the_fused_step_in_float32(models):
    """bfloat16 ("mixed": prefill through dense copies) decodes fused too, in float32 with the K/V
    rounded to bfloat16 in the pool: near the file dequantized (float32, dense). Measured: 97.3%
    of greedy tokens agree, logits 0.140 apart on average, 1.56 at most (the eager bfloat16 path:
    98.4%, 0.174, 1.43; dense bfloat16 itself: 97.7%, 0.091, 0.66)."""
    _, dense, tokenizer = models
    mixed, _ = load_model("smollm2", torch.device("cpu"), torch.bfloat16)
    assert mixed.weights_format == "mixed" and unsupported(mixed) is None
    ids = torch.tensor(tokenizer.encode(PROSE)[:POSITIONS])
    pool = _pool(mixed, POSITIONS // BLOCK + 1).to(torch.bfloat16)
    table = torch.arange(pool.shape[1]).view(1, -1)
    step = FusedDecode(mixed)
    fused = torch.cat([step(ids[p : p + 1], torch.tensor([p]), table, pool) for p in range(POSITIONS)])
    theirs = dense.forward_reference(ids)
    agreement = (fused.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    assert agreement >= MIN_AGREEMENT, f"the fused bfloat16 step agrees with dense on {agreement:.1%}"
    difference = (fused - theirs).abs()
    assert difference.max().item() <= MAX_LOGIT_DIFFERENCE and difference.mean().item() <= MAX_MEAN_LOGIT_DIFFERENCE


def test_a_rows_logits_do_not_depend_on_its_batch(models):
    quantized, _, tokenizer = models
    step = FusedDecode(quantized)
    ids = torch.tensor(tokenizer.encode(PROSE)[:40])
    pool = _pool(quantized, 16)
    tables = torch.tensor([[0, 1, 2, 15], [3, 4, 5, 15], [6, 7, 8, 15]])
    for p in range(39):  # three sequences share the pool, each in its own blocks
        step(ids[p : p + 1].repeat(3), torch.tensor([p] * 3), tables, pool)
    together = step(ids[39:40].repeat(3), torch.tensor([39, 20, 5]), tables, pool.clone())
    for r, position in enumerate((39, 20, 5)):
        alone = step(ids[39:40], torch.tensor([position]), tables[r : r + 1], pool.clone())
        assert torch.equal(alone, together[r : r + 1])
    assert not torch.equal(together[0], together[1])


def test_lookups_read_the_lm_heads_blocks_as_the_dense_table_holds_them(models):
    quantized, dense, _ = models
    # the tied embedding is the Q8_0 lm_head: no dense table is kept for the lookups
    assert isinstance(quantized.model.embed_tokens, BlockEmbedding)
    assert not any("embed_tokens" in name for name in quantized.state_dict())
    ids = torch.randint(0, quantized.config.vocab_size, (2000,), generator=torch.Generator().manual_seed(0))
    assert torch.equal(quantized.model.embed_tokens(ids), dense.model.embed_tokens.weight[ids])
    assert quantized.model.embed_tokens(ids.view(40, 50)).shape == (40, 50, quantized.config.hidden_size)
    for bad in (quantized.config.vocab_size, -1):
        with pytest.raises(RuntimeError, match="is not below"):
            quantized.model.embed_tokens(torch.tensor([3, bad]))
    assert torch.equal(quantized.model.embed_tokens(ids[:5]), dense.model.embed_tokens.weight[ids[:5]])


def test_bad_indices_are_refused_and_the_step_keeps_serving(models):
    quantized, _, _ = models
    step = FusedDecode(quantized)
    pool = _pool(quantized, 4)
    good = step(torch.tensor([5]), torch.tensor([0]), torch.tensor([[1]]), pool)
    for positions, table, match in (
        ([16], [[1]], "outside its block table"),
        ([-1], [[1]], "outside its block table"),
        ([0], [[4]], "not in the pool"),
        ([0], [[-2]], "not in the pool"),
    ):
        with pytest.raises(RuntimeError, match=match):
            step(torch.tensor([5]), torch.tensor(positions), torch.tensor(table), pool)
    with pytest.raises(RuntimeError, match="int64"):
        step(torch.tensor([5]), torch.tensor([0], dtype=torch.int32), torch.tensor([[1]]), pool)
    assert torch.equal(step(torch.tensor([5]), torch.tensor([0]), torch.tensor([[1]]), pool), good)


def test_the_engine_decodes_through_the_fused_step_or_without_it(make_engine, loop_thread, models):
    quantized, _, tokenizer = models
    common = dict(model="smollm2", dtype="float32", num_blocks=32, max_model_len=256, torch_threads=1)
    fused, eager = make_engine(**common), make_engine(**common, fused_decode=False)
    assert fused.runner.fused is not None and eager.runner.fused is None
    prompt = tokenizer.encode(PROSE)[:DECODE_PROMPT_TOKENS]
    for engine in (fused, eager):
        out = loop_thread.run(complete(engine, prompt, greedy(DECODE_TOKENS))).token_ids
        assert len(out) == DECODE_TOKENS
        # Each generated token is the eager full-sequence pass's greedy choice at its position
        # (a free-running comparison would diverge for good at the first near tie).
        expected = quantized.forward_reference(torch.tensor(prompt + out))[len(prompt) - 1 : -1].argmax(-1).tolist()
        agreement = sum(a == b for a, b in zip(out, expected)) / DECODE_TOKENS
        assert agreement >= MIN_DECODE_AGREEMENT, f"decode steps agree with the reference on {agreement:.1%}"
