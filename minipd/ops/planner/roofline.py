"""Step times from a roofline, fitted into DistServe's linear form.

A step takes the longer of its compute (FLOPs / (peak FLOP/s x efficiency)) and its memory
traffic (bytes / (bandwidth x efficiency)), plus a fixed per-step overhead and, under tensor
parallelism, two all-reduces per layer. The roofline is sampled over the operating range of
the instance (prompt batches up to the token budget, decode batches up to `max_num_seqs` at
short and long contexts) and fitted with the very fit a measured profile gets, so a derived
profile and a measured one are the same kind of object, and the fit statistics say how well
the linear form follows the roofline's max().
"""

from __future__ import annotations

import msgspec

from minipd.ops.planner.kv_sizing import dtype_bytes, kv_bytes_per_token, kv_capacity_tokens
from minipd.ops.planner.latency_model import DecodeSample, PrefillSample, fit_decode, fit_prefill
from minipd.ops.planner.latency_profile import LatencyProfile

GIB = 2**30


class Accelerator(msgspec.Struct, frozen=True):
    name: str
    peak_flops: float  # dense 16-bit tensor FLOP/s
    memory_bytes: float  # HBM
    memory_bw: float  # HBM bytes/s
    nvlink_bw: float  # bytes/s per direction, for tensor-parallel all-reduces
    nic_gbps: float  # RDMA NIC per GPU, Gbit/s: the KV link between instances
    source: str  # where the numbers come from


class ModelShape(msgspec.Struct, frozen=True):
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    mlp_matrices: int = 3  # 3 for a gated (SwiGLU) MLP, 2 for a plain one (OPT)
    tie_word_embeddings: bool = False

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies through, per forward: attention and MLP of all layers."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attention = h * self.num_heads * self.head_dim * 2 + h * kv * 2  # q and o, k and v
        return self.num_layers * (attention + self.mlp_matrices * h * self.intermediate_size)

    @property
    def params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.matmul_params + embeddings


class Efficiency(msgspec.Struct, frozen=True):
    """The fractions of the datasheet peaks a serving engine reaches, and fixed costs.
    These are assumptions (typical of published vLLM/SGLang figures), not measurements."""

    prefill_mfu: float = 0.5  # model FLOPs utilisation of prefill matmuls and attention
    decode_mfu: float = 0.5  # of the small per-token matmuls of decode
    memory: float = 0.8  # achieved fraction of HBM bandwidth when streaming weights and KV
    link: float = 0.8  # achieved fraction of the NIC line rate for KV transfers
    step_overhead_s: float = 1.5e-3  # scheduling, input preparation, launches (CUDA graphs)
    allreduce_latency_s: float = 8e-6  # one small NCCL all-reduce over NVLink
    memory_utilization: float = 0.9  # of HBM the engine may use (vLLM's gpu_memory_utilization)
    reserve_bytes_per_gpu: float = 4 * GIB  # activations, workspace, CUDA graphs
    link_setup_s: float = 0.5e-3  # per KV transfer: descriptors, notification, completion


def _times(model: ModelShape, accel: Accelerator, tp: int, dtype: str, eff: Efficiency):
    """Roofline step-time functions (prefill over prompt lengths, decode over context lengths)."""
    nbytes = dtype_bytes(dtype)
    weights = model.params * nbytes
    kvb = kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim, dtype)
    flops = tp * accel.peak_flops
    bandwidth = tp * accel.memory_bw * eff.memory
    if tp > 1:  # two all-reduces of the hidden state per layer; ring: 2(tp-1)/tp of it crosses NVLink
        ar_fixed = 2 * model.num_layers * eff.allreduce_latency_s
        ar_per_token = 2 * model.num_layers * model.hidden_size * nbytes * 2 * (tp - 1) / tp / accel.nvlink_bw
    else:
        ar_fixed = ar_per_token = 0.0
    # Causal attention: QK^T and PV over the n^2/2 (query, key) pairs of a prompt, 2 FLOPs per
    # multiply-add, over every head of every layer.
    attn_flops_per_pair = 2 * 2 * model.num_heads * model.head_dim * model.num_layers

    def prefill_s(lens: list[int]) -> float:
        tokens = sum(lens)
        compute = (
            2 * model.matmul_params * tokens
            + attn_flops_per_pair * sum(n * n / 2 for n in lens)
            + 2 * model.vocab_size * model.hidden_size * len(lens)
        ) / (flops * eff.prefill_mfu)
        memory = (weights + kvb * tokens) / bandwidth
        return eff.step_overhead_s + ar_fixed + ar_per_token * tokens + max(compute, memory)

    def decode_s(contexts: list[int]) -> float:
        batch = len(contexts)
        compute = (
            2 * (model.matmul_params + model.vocab_size * model.hidden_size) * batch
            + attn_flops_per_pair * sum(contexts)
        ) / (flops * eff.decode_mfu)
        memory = (weights + kvb * sum(contexts)) / bandwidth
        return eff.step_overhead_s + ar_fixed + ar_per_token * batch + max(compute, memory)

    return prefill_s, decode_s, weights, kvb


DEFAULT_EFFICIENCY = Efficiency()
PREFILL_GRID_LENS = (128, 256, 512, 1024, 2048, 4096, 8192)
DECODE_GRID_BATCHES = (1, 4, 16, 32, 64, 128, 256)
DECODE_GRID_CONTEXTS = (256, 1024, 4096)


def roofline_profile(
    name: str,
    model: ModelShape,
    accel: Accelerator,
    *,
    tensor_parallel: int = 1,
    dtype: str = "bfloat16",
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    max_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    notes: str = "",
) -> LatencyProfile:
    """A profile of `model` on `tensor_parallel` GPUs of `accel`, fitted to the roofline over
    the instance's operating range."""
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel: must be >= 1, got {tensor_parallel}")
    prefill_s, decode_s, weights, kvb = _times(model, accel, tensor_parallel, dtype, efficiency)
    prefill_samples = []
    for n in PREFILL_GRID_LENS:
        for count in (1, 2, 4, 8):
            if n * count <= max(max_batched_tokens, n):
                prefill_samples.append(PrefillSample([n] * count, prefill_s([n] * count)))
    decode_samples = [
        DecodeSample([ctx] * b, decode_s([ctx] * b))
        for b in DECODE_GRID_BATCHES
        if b <= max_num_seqs
        for ctx in DECODE_GRID_CONTEXTS
    ]
    prefill, prefill_fit = fit_prefill(prefill_samples)
    decode, decode_fit = fit_decode(decode_samples)
    capacity = kv_capacity_tokens(
        tensor_parallel * accel.memory_bytes * efficiency.memory_utilization,
        weights,
        tensor_parallel * efficiency.reserve_bytes_per_gpu,
        kvb,
    )
    return LatencyProfile(
        name=name,
        model=model.name,
        dtype=dtype,
        device=f"{tensor_parallel}x {accel.name}",
        tensor_parallel=tensor_parallel,
        num_layers=model.num_layers,
        kv_bytes_per_token=kvb,
        kv_capacity_tokens=capacity,
        max_batched_tokens=max_batched_tokens,
        max_num_seqs=max_num_seqs,
        prefill=prefill,
        decode=decode,
        prefill_fit=prefill_fit,
        decode_fit=decode_fit,
        link_gbps=tensor_parallel * accel.nic_gbps * efficiency.link,
        link_setup_s=efficiency.link_setup_s,
        source="roofline",
        notes=notes or f"roofline of {accel.source}; {efficiency}",
    )
