"""minipd's float32 prefill kernels (models/kernel_steps/prefill_kernels.py: attention, norms, SiLU) in SmolLM2
served from its Q4_1 file in float32, where the engine takes them by default: teacher-forced greedy tokens and
logits of a prompt prefilled in chunks against the same file dequantized (dense float32, full
causal attention), as close as the SDPA path is; and the same bits whatever the chunks. (The
engine's tokens with them, disaggregated against colocated: test_smollm2_disagg.py, whose float32
engines prefill through them on both sides.)"""

from __future__ import annotations

import pytest
import torch
from gguf_helpers import PROSE, requires_smollm2

from minipd.engine.model_loader import load_model
from minipd.engine.model_runner import _chunk_mask
from minipd.models.arch.paged_attention import AttentionMetadata, GatherBuffers, PrefillSpan, slot_rows
from minipd.models.kernel_steps.prefill_kernels import PrefillKernels
from minipd.models.kernels import vnni_kernels

pytestmark = [
    requires_smollm2,
    pytest.mark.skipif(vnni_kernels.best() is None, reason="none of minipd's int8 kernels runs on this CPU"),
]

POSITIONS = 600
CHUNKINGS = ([512, 88], [100, 300, 200])
BLOCK = 16
MIN_AGREEMENT = 0.95
# What the arithmetic allows. The 4-bit path rounds every activation to int8 per block of 32
# (an error of up to half a step, 1/254 of the block's largest value) before each of a layer's
# matmuls; over 30 layers that adds a noise to the logits (up to ~34 here) whose size the
# rounding sets, not the CPU: a mean |logit difference| of 0.17-0.19 and a 99th percentile of
# each position's largest difference of 1.2-1.6 against the dense float32 model, measured on
# AVX2, AVX-512 and AMX machines alike, kernel and torch's ops alike. The single largest
# difference among 600 x 49k logits is a tail of that noise, and moves with the last bits of
# each CPU family's float32 summation order (1.8 to 3.6 measured), so it bounds gross errors
# only: a wrong mask, head or block gives differences of 10+ and agreement far below.
MAX_MEAN_LOGIT_DIFFERENCE = 0.3
MAX_P99_POSITION_DIFFERENCE = 2.5
MAX_LOGIT_DIFFERENCE = 6.0
# The kernel rounds as torch's ops do: its mean difference stays near theirs, in the same run.
MAX_MEAN_RATIO_TO_TORCH = 1.25


@pytest.fixture(scope="module")
def models():
    cpu = torch.device("cpu")
    quantized, tokenizer = load_model("smollm2", cpu, torch.float32)  # auto: quantized in float32
    dense, _ = load_model("smollm2", cpu, torch.float32, weights="dense")
    ids = torch.tensor(tokenizer.encode(PROSE * 4)[:POSITIONS])
    assert len(ids) == POSITIONS
    return quantized, dense, ids


def _prefill_logits(model, ids: torch.Tensor, chunks: list[int], kernels) -> torch.Tensor:
    """Logits at every position of a prompt prefilled chunk after chunk into a paged pool whose
    blocks come out of order, as the engine's runner would run it."""
    c, cpu = model.config, torch.device("cpu")
    blocks = list(range(len(ids) // BLOCK + 1, 0, -1))
    pool = torch.zeros(c.num_layers, len(blocks) + 1, 2, BLOCK, c.num_kv_heads, c.head_dim)
    buffers = GatherBuffers((BLOCK, c.num_kv_heads, c.head_dim), torch.float32, cpu)
    logits, start = [], 0
    for size in chunks:
        end = start + size
        positions = list(range(start, end))
        rows = slot_rows([blocks[p // BLOCK] for p in positions], [p % BLOCK for p in positions], BLOCK)
        span = PrefillSpan(0, size, end, torch.tensor(blocks[: -(-end // BLOCK)]), _chunk_mask(size, end, BLOCK, cpu))
        meta = AttentionMetadata(torch.tensor(rows), 0, (), (span,))
        logits.append(
            model(ids[start:end], torch.tensor(positions), pool, meta, torch.arange(size), buffers, None, None, kernels)
        )
        start = end
    return torch.cat(logits)


def test_a_chunked_prefill_through_the_kernel_stays_near_the_dequantized_model(models):
    quantized, dense, ids = models
    kernel = PrefillKernels.of(quantized, torch.float32)
    assert kernel is not None and kernel.kernel == vnni_kernels.best()
    theirs = dense.forward_reference(ids)
    for chunks in CHUNKINGS:
        means = {}
        for name, kernels in (("kernels", kernel), ("torch", None)):
            ours = _prefill_logits(quantized, ids, chunks, kernels)
            agreement = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
            assert agreement >= MIN_AGREEMENT, f"{name}, chunks {chunks}: agrees with dense on {agreement:.1%}"
            difference = (ours - theirs).abs()
            means[name] = difference.mean().item()
            per_position = difference.max(-1).values.quantile(0.99).item()
            assert means[name] <= MAX_MEAN_LOGIT_DIFFERENCE, (name, chunks, means[name])
            assert per_position <= MAX_P99_POSITION_DIFFERENCE, (name, chunks, per_position)
            assert difference.max().item() <= MAX_LOGIT_DIFFERENCE, (name, chunks, difference.max().item())
        assert means["kernels"] <= MAX_MEAN_RATIO_TO_TORCH * means["torch"], (chunks, means)


def test_the_kernels_logits_do_not_depend_on_the_chunks(models):
    quantized, _, ids = models
    kernel = PrefillKernels.of(quantized, torch.float32)
    whole = _prefill_logits(quantized, ids, [POSITIONS], kernel)
    for chunks in CHUNKINGS:
        assert torch.equal(_prefill_logits(quantized, ids, chunks, kernel), whole), chunks
