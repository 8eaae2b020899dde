"""minipd's float32 prefill kernels (models/kernels/prefill_attention.cpp and row_ops.cpp, built into
each int8 kernel variant that runs on this CPU) against float64 models of what they compute:
causal attention over the pool's blocks (grouped-query and plain heads, chunks after a cached
prefix, blocks out of order), RMSNorm, SiLU(gate) * up; a row's result the same bits whatever the
chunks, the rows beside it and the threads; paged_attention routing prefill spans through the
attention and decode rows as before; the engine choosing them exactly for float32 models served
by the int8 kernels; bad input refused with the ops still serving."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_helpers import TINY, hf_weights, write_llama_gguf

from minipd.engine.model_loader import load_model
from minipd.engine.model_runner import ModelRunner, _chunk_mask
from minipd.models.arch.paged_attention import (
    AttentionMetadata,
    DecodeGroup,
    GatherBuffers,
    PrefillSpan,
    paged_attention,
)
from minipd.models.kernel_steps.prefill_kernels import PrefillKernels, unsupported
from minipd.models.kernels import vnni_kernels

RUNNABLE = [v for v in vnni_kernels.VARIANTS if vnni_kernels.unavailable(v) is None]
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no variant of minipd's int8 kernels runs on this CPU")
VARIANTS = [
    pytest.param(v, marks=pytest.mark.skipif(bool(why), reason=f"no {v} kernels here: {why}"))
    for v, why in ((v, vnni_kernels.unavailable(v)) for v in vnni_kernels.VARIANTS)
]
NUM_BLOCKS = 64
# float32 against float64: the scores, a polynomial exp and the running sums round; outputs are
# weighted means of values ~N(0, 1).
TOLERANCE = 2e-5


def _op(variant: str):
    vnni_kernels.load(variant)
    return getattr(torch.ops, f"minipd_{variant}").prefill_attention


def _pool(block_size: int, kv_heads: int, head_dim: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(NUM_BLOCKS, 2, block_size, kv_heads, head_dim, generator=g)


def _blocks(context_len: int, block_size: int, seed: int = 1) -> torch.Tensor:
    """The sequence's blocks, in a shuffled order as a pool hands them out."""
    order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed))
    return order[: -(-context_len // block_size)]


def _reference(q: torch.Tensor, pool: torch.Tensor, blocks: torch.Tensor, context_len: int, scale: float):
    """float64 softmax(scale q k^T) v, query t of the chunk seeing keys up to context_len - T + t."""
    t, heads, _ = q.shape
    kv = pool[blocks].double()
    k = kv[:, 0].flatten(0, 1)[:context_len].repeat_interleave(heads // pool.shape[3], dim=1)
    v = kv[:, 1].flatten(0, 1)[:context_len].repeat_interleave(heads // pool.shape[3], dim=1)
    scores = torch.einsum("thd,jhd->htj", q.double(), k) * scale
    visible = torch.arange(context_len)[None, :] <= (context_len - t + torch.arange(t))[:, None]
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("htj,jhd->thd", weights, v)


def _queries(t: int, heads: int, kv_heads: int, head_dim: int, seed: int = 2) -> torch.Tensor:
    """q as the model hands it over: the first heads of a fused q/k/v output (rows strided)."""
    qkv = torch.randn(t, heads + 2 * kv_heads, head_dim, generator=torch.Generator().manual_seed(seed))
    return qkv[:, :heads]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size",
    [(9, 3, 64, 16), (4, 4, 32, 8), (8, 1, 16, 4), (6, 2, 48, 16)],
    ids=["gqa3", "mha", "mqa", "head48"],
)
@pytest.mark.parametrize("t,prefix", [(1, 0), (7, 0), (70, 0), (13, 50), (1, 133), (150, 37)])
def test_it_is_causal_attention_over_the_pools_blocks(variant, heads, kv_heads, head_dim, block_size, t, prefix):
    pool, q = _pool(block_size, kv_heads, head_dim), _queries(t, heads, kv_heads, head_dim)
    blocks, context = _blocks(prefix + t, block_size), prefix + t
    out = _op(variant)(q, pool, blocks, context, head_dim**-0.5)
    assert out.shape == (t, heads, head_dim) and out.dtype == torch.float32
    expected = _reference(q, pool, blocks, context, head_dim**-0.5)
    assert (out.double() - expected).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_rows_result_does_not_depend_on_its_chunk_its_neighbours_or_the_threads(variant):
    """Every row sums its keys in blocks counted from the sequence's start, so a prompt split
    into any chunks (as chunked prefill and the prefix cache split it) gets the same bits."""
    op, pool, q = _op(variant), _pool(16, 3, 64), _queries(300, 9, 3, 64)
    blocks = _blocks(300, 16)
    whole = op(q, pool, blocks, 300, 0.125)
    for cuts in ([0, 1, 300], [0, 128, 200, 300], [0, 37, 38, 299, 300]):
        parts = [op(q[a:b], pool, blocks, b, 0.125) for a, b in zip(cuts, cuts[1:])]
        assert torch.equal(torch.cat(parts), whole), cuts
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(op(q, pool, blocks, 300, 0.125), whole)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("variant", VARIANTS)
def test_paged_attention_sends_prefill_spans_to_it_and_decode_rows_as_before(variant):
    block_size, kv_heads, head_dim, heads = 16, 3, 64, 9
    pool = _pool(block_size, kv_heads, head_dim)
    decode_blocks, first, second = _blocks(40, block_size, 5), _blocks(90, block_size, 6), _blocks(21, block_size, 7)
    decodes = 2
    q = torch.randn(decodes + 30 + 21, heads, head_dim, generator=torch.Generator().manual_seed(3))
    width = decode_blocks.numel()
    meta = AttentionMetadata(
        slot_rows=torch.zeros(0, dtype=torch.long),  # not read by paged_attention
        num_decodes=decodes,
        decode_groups=(DecodeGroup(0, decodes, torch.cat([decode_blocks, decode_blocks]), width, None),),
        prefills=(
            PrefillSpan(
                decodes, 30, 90, first, _chunk_mask(30, 90, block_size, torch.device("cpu"))
            ),  # after 60 cached
            PrefillSpan(decodes + 30, 21, 21, second, None),
        ),
    )
    buffers = GatherBuffers((block_size, kv_heads, head_dim), torch.float32, torch.device("cpu"))
    kernel = PrefillKernels(variant).attention
    with_kernel = paged_attention(q, pool, meta, buffers, head_dim**-0.5, kernel)
    with_sdpa = paged_attention(q, pool, meta, buffers, head_dim**-0.5)
    assert torch.equal(with_kernel[:decodes], with_sdpa[:decodes])
    assert torch.equal(with_kernel[decodes : decodes + 30], kernel(q[decodes : decodes + 30], pool, first, 90, 0.125))
    assert torch.equal(with_kernel[decodes + 30 :], kernel(q[decodes + 30 :], pool, second, 21, 0.125))
    assert torch.allclose(with_kernel, with_sdpa, atol=TOLERANCE)
    # the SDPA path with its masks is the same attention: the kernel's rows are not just self-consistent
    expected = _reference(q[decodes : decodes + 30], pool, first, 90, head_dim**-0.5)
    assert (with_sdpa[decodes : decodes + 30].double() - expected).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_input_is_refused_and_the_op_keeps_serving(variant):
    op, pool, q = _op(variant), _pool(16, 3, 64), _queries(10, 9, 3, 64)
    blocks = _blocks(10, 16)
    cases = [
        ((q.to(torch.bfloat16), pool, blocks, 10, 0.1), "float32"),
        ((q, pool.to(torch.bfloat16), blocks, 10, 0.1), "pool"),
        ((q, _pool(16, 3, 32), blocks, 10, 0.1), "head_dim"),
        ((_queries(10, 8, 3, 64), pool, blocks, 10, 0.1), "kv heads"),
        ((q, pool, blocks, 9, 0.1), "below"),
        ((q, pool, blocks, 40, 0.1), "cannot hold"),
        ((q, pool, torch.tensor([NUM_BLOCKS]), 10, 0.1), "not in the pool"),
        ((q, pool, torch.tensor([-1]), 10, 0.1), "not in the pool"),
        ((_queries(10, 9, 3, 40), _pool(16, 3, 40), blocks, 10, 0.1), "multiple of 16"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            op(*args)
    assert op(q[:0], pool, blocks, 0, 0.1).shape == (0, 9, 64)
    assert (op(q, pool, blocks, 10, 0.125).double() - _reference(q, pool, blocks, 10, 0.125)).abs().max() <= TOLERANCE


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("prefill-attention") / "tiny.gguf"
    return str(write_llama_gguf(path, TINY, hf_weights(TINY), GGMLQuantizationType.Q4_1))


def test_the_engine_takes_it_for_float32_models_served_by_the_int8_kernels_only(q4_model):
    cpu = torch.device("cpu")
    quantized, _ = load_model(q4_model, cpu, torch.float32, weights="quantized")
    assert unsupported(quantized, torch.float32) is None
    assert "float32" in unsupported(quantized, torch.bfloat16)  # a pool of another dtype
    assert "does not use" in unsupported(load_model(q4_model, cpu, torch.float32, weights="dense")[0], torch.float32)
    assert "float32" in unsupported(load_model(q4_model, cpu, torch.bfloat16)[0], torch.bfloat16)
    pool = torch.zeros(TINY.num_layers, 8, 2, 16, TINY.num_kv_heads, TINY.head_dim)
    runner = ModelRunner(quantized, pool)
    assert runner.prefill is not None and runner.prefill.kernel == quantized.quantized_kernel
    assert ModelRunner(quantized, pool, prefill_kernels=False).prefill is None


def _rows(rows: int, features: int, seed: int = 4, scale: float = 3.0) -> torch.Tensor:
    """Rows with a column stride past their width (a view), values over a wide range."""
    x = torch.randn(rows, features + 8, generator=torch.Generator().manual_seed(seed)) * scale
    return x[:, :features]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rms_norm_and_silu_mul_are_the_ops_they_replace(variant):
    kernels = PrefillKernels(variant)
    x, weight = _rows(37, 576), torch.randn(576, generator=torch.Generator().manual_seed(5))
    expected = weight.double() * x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    assert (kernels.rms_norm(x, weight, 1e-5).double() - expected).abs().max().item() <= 2e-5
    gate_up = _rows(37, 2 * 96, scale=10.0)
    gate_up[0, :4] = torch.tensor([0.0, -100.0, 100.0, -0.0])  # e^-x would overflow at -100
    gate, up = gate_up.double().chunk(2, dim=-1)
    expected = gate * torch.sigmoid(gate) * up
    out = kernels.silu_mul(gate_up)
    assert out.shape == (37, 96) and torch.isfinite(out).all()
    assert (out.double() - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_norm_or_silu_row_does_not_depend_on_the_rows_beside_it(variant):
    kernels, x, weight = PrefillKernels(variant), _rows(50, 64), torch.ones(64)
    assert torch.equal(kernels.rms_norm(x[7:8], weight, 1e-6), kernels.rms_norm(x, weight, 1e-6)[7:8])
    assert torch.equal(kernels.silu_mul(x[7:9]), kernels.silu_mul(x)[7:9])


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_row_ops_refuse_bad_input_and_keep_serving(variant):
    kernels, x = PrefillKernels(variant), _rows(3, 64)
    for call, message in (
        (lambda: kernels.rms_norm(x.double(), torch.ones(64), 1e-6), "float32"),
        (lambda: kernels.rms_norm(x, torch.ones(63), 1e-6), "64 values"),
        (lambda: kernels.rms_norm(_rows(3, 60), torch.ones(60), 1e-6), "multiple of 8"),
        (lambda: kernels.silu_mul(_rows(3, 40)), "multiple of 16"),
        (lambda: kernels.silu_mul(x.t()), "contiguous rows"),
    ):
        with pytest.raises(RuntimeError, match=message):
            call()
    assert kernels.silu_mul(x).shape == (3, 32) and kernels.rms_norm(x, torch.ones(64), 1e-6).shape == (3, 64)
