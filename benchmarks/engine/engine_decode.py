"""Decode step time: the engine, the raw model loop, and the weight-streaming floor.

- engine: `batch` requests through minipd's engine (scheduling, input building, sampling,
  detokenizing, streaming on asyncio); a step is the time from the end of one forward pass
  to the end of the next (everything the engine does in between included), over the decode
  steps after the last request's first token.
- raw: the model's forward pass in a loop on prebuilt inputs and attention metadata, argmax
  on the logits (what a step costs with no engine around it), each step timed alone.
- floor: a decode step reads every weight once, so it cannot beat the time a memcpy of the
  weights' bytes takes (the bandwidth measured on the same thread, in the same run); for a
  model served quantized those are the bytes it reads: the 4-bit projections' packed values,
  scales and zeros, plus whatever stays dense.
Everything runs on the engine's compute thread, so all three use the same OpenMP team. Each
is timed twice: wall time, and this process's CPU time (all threads: the engine's event loop
counts), which on a machine other jobs share says what the work cost. A step figure is the
median of the steps of one run, so one step that the machine preempts (or a garbage
collection) does not move it; this machine's memory bandwidth drifts by ±10% over seconds,
which is why the caller pairs each figure with one measured right beside it.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import NamedTuple

import torch

from minipd.engine.engine import Engine
from minipd.engine.model_runner import ModelRunner
from minipd.engine.request import Request
from minipd.engine.sampling_params import SamplingParams
from minipd.engine.scheduler import ScheduledChunk
from minipd.models.weights.quantized_linear import QuantizedLinear

MEMCPY_ROUNDS = 3  # the fastest of these counts (the floor is a best case)


class Timing(NamedTuple):
    wall_s: float
    cpu_s: float
    forward_cpu_s: float = 0.0  # engine only: of `cpu_s`, the compute thread's time inside the model's forward


def _now() -> Timing:
    return Timing(time.perf_counter(), time.process_time())


def _per(start: Timing, end: Timing, count: int) -> Timing:
    return Timing((end.wall_s - start.wall_s) / count, (end.cpu_s - start.cpu_s) / count)


def _median_step(marks: list[tuple[float, float, float]]) -> Timing:
    """Median per-step wall, process CPU and forward CPU time between consecutive marks
    (wall, process CPU, forward CPU of the step that ended at the mark)."""
    steps = list(zip(marks, marks[1:]))
    return Timing(
        statistics.median(b[0] - a[0] for a, b in steps),
        statistics.median(b[1] - a[1] for a, b in steps),
        statistics.median(b[2] for _, b in steps),
    )


def prompts(batch: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(batch)]


async def engine_step(engine: Engine, batch_prompts: list[list[int]], output_len: int) -> Timing:
    """The median decode step of the engine serving `batch_prompts` to `output_len` tokens
    each. Also times the model's forward passes on the compute thread (`forward_cpu_s`), so
    that what the engine adds around them (scheduling, inputs, sampling, streaming) is
    measured within the same steps, free of the drift between two separate runs."""
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    first_tokens: list[float] = []
    marks: list[tuple[float, float, float]] = []  # at the end of each forward: wall, process CPU, its thread CPU

    def timed(forward):
        def timed_forward(*args, **kwargs):
            start = time.thread_time()
            try:
                return forward(*args, **kwargs)
            finally:
                marks.append((time.perf_counter(), time.process_time(), time.thread_time() - start))

        return timed_forward

    async def one(prompt: list[int]) -> None:
        async for out in engine.generate(prompt, params):
            if out.num_output_tokens == len(out.token_ids):  # the increment carrying the first token
                first_tokens.append(time.perf_counter())

    engine.model.forward = timed(engine.model.forward)
    fused = engine.runner.fused  # decode rows' forward where the engine fuses them (fused_decode.py)
    if fused is not None:
        engine.runner.fused = timed(fused)
    try:
        await asyncio.gather(*(one(p) for p in batch_prompts))
    finally:
        del engine.model.forward  # back to the class's method
        engine.runner.fused = fused
    # The last prefill's forward ended before its first token was seen: decode steps follow it.
    decode_marks = [m for m in marks if m[0] < max(first_tokens)][-1:] + [m for m in marks if m[0] > max(first_tokens)]
    if len(decode_marks) < 2:
        raise RuntimeError(f"engine_step: {output_len} output tokens leave no decode step to time")
    return _median_step(decode_marks)


def raw_step(engine: Engine, batch_prompts: list[list[int]], output_len: int) -> Timing:
    """The median decode step of the raw loop: prefill untimed, then decode with inputs and
    attention metadata all built before timing. Call it on the engine's compute thread."""
    runner = ModelRunner(
        engine.model,
        engine.kv_pool,
        fused_decode=engine.config.fused_decode,
        prefill_kernels=engine.config.prefill_kernels,
    )
    bm = engine.block_manager
    requests = []
    for i, prompt in enumerate(batch_prompts):
        request = Request(f"raw-{i}", list(prompt), SamplingParams(max_tokens=output_len, temperature=0.0))
        request.block_ids = bm.reserve(bm.blocks_for(len(prompt) + output_len))
        requests.append(request)
    try:
        first = runner.execute([ScheduledChunk(r, len(r.token_ids), True) for r in requests])
        steps = []
        for _ in range(output_len - 1):
            for r in requests:
                r.num_computed_tokens = len(r.token_ids)
                r.token_ids.append(first[0])  # placeholder id; the loop feeds argmax output instead
            _, positions, meta, _, _ = runner._prepare([ScheduledChunk(r, 1, True) for r in requests])
            steps.append((positions, meta, _block_tables(requests, runner.block_size, engine.device)))
        index = torch.arange(len(requests), device=engine.device)
        next_ids = torch.tensor(first, device=engine.device)
        marks = [(time.perf_counter(), time.process_time(), 0.0)]
        for positions, meta, tables in steps:
            if runner.fused is not None:  # the step the engine runs: fused_decode.py
                logits = runner.fused(next_ids, positions, tables, engine.kv_pool)
            else:
                logits = engine.model(next_ids, positions, engine.kv_pool, meta, index, runner.buffers)
            next_ids = logits.argmax(dim=-1)
            next_ids.tolist()  # wait for the device, so that each step is timed alone
            marks.append((time.perf_counter(), time.process_time(), 0.0))
        return _median_step(marks)
    finally:
        for r in requests:
            bm.free(r.block_ids)


def _block_tables(requests: list[Request], block_size: int, device: torch.device) -> torch.Tensor:
    """The fused step's [rows, max_blocks] block tables at each request's current position."""
    width = max(r.num_computed_tokens // block_size + 1 for r in requests)
    return torch.tensor(
        [r.block_ids[:width] + [0] * (width - len(r.block_ids[:width])) for r in requests], device=device
    )


def _weights(model) -> list[torch.Tensor]:
    """The model's parameters and the 4-bit projections' buffers (not the RoPE tables)."""
    quantized = [b for m in model.modules() if isinstance(m, QuantizedLinear) for b in m.buffers()]
    return [*model.parameters(), *quantized]


def _distinct_bytes(tensors: list[torch.Tensor], skip: set[int] = frozenset()) -> int:
    """Bytes the tensors span, each storage counted once: from its first used byte to its last
    (views of one fused weight count once; the 4-bit buffers packed side by side in one
    huge-page arena count as themselves, not as the arena's unused slack). `skip`: storages
    (by data_ptr) left out."""
    spans: dict[int, tuple[int, int]] = {}
    for t in tensors:
        storage = t.untyped_storage().data_ptr()
        if storage in skip:
            continue
        start = t.data_ptr() - storage
        end = start + t.numel() * t.element_size()
        low, high = spans.get(storage, (start, end))
        spans[storage] = (min(low, start), max(high, end))
    return sum(high - low for low, high in spans.values())


def weight_bytes(model) -> int:
    """Bytes of the weights one decode step reads: every distinct weight storage (quantized
    buffers included), except an input embedding the lm_head does not read (of which a step
    reads one row per token): an untied one, or a tied one whose lm_head reads its quantized
    blocks instead."""
    reads_embedding = model.config.tie_word_embeddings and model.quant_lm_head is None
    table = getattr(model.model.embed_tokens, "weight", None)  # none where lookups read the head's blocks
    skip = set() if reads_embedding or table is None else {table.untyped_storage().data_ptr()}
    return _distinct_bytes(_weights(model), skip)


def resident_weight_bytes(model) -> dict[str, int]:
    """What the weights hold in memory: `weights`, every distinct weight storage (the plain
    parameters and the 4-bit buffers), `prepacked`, the copies packed for oneDNN's bf16
    matmuls that sit beside the plain weights (prepacked_linear.py), and `dense_copy`, the
    4-bit projections' dense copies that prefill rows multiply (weights "mixed")."""
    weights = _distinct_bytes(_weights(model))
    copies = [getattr(m, n) for m in model.modules() for n in vars(m) if n.startswith("packed_")]
    prepacked = sum(t.numel() * t.element_size() for t in copies if isinstance(t, torch.Tensor))
    return {"weights": weights, "prepacked": prepacked, "dense_copy": model.dense_copy_nbytes}


def memcpy(num_bytes: int) -> Timing:
    """A torch copy of `num_bytes` between two buffers (the fastest of a few). Call it on the
    compute thread, so it runs on the same OpenMP team as the forward pass."""
    src = torch.ones(num_bytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    rounds = []
    for _ in range(MEMCPY_ROUNDS):
        start = _now()
        dst.copy_(src)
        rounds.append(_per(start, _now(), 1))
    return Timing(min(r.wall_s for r in rounds), min(r.cpu_s for r in rounds))
