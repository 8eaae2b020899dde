"""Decode step time: the engine, the raw model loop, and the weight-streaming floor.

- engine: `batch` requests through minipd's engine (scheduling, input building, sampling,
  detokenizing, streaming on asyncio); the step time is the time from the last request's
  first token to the last token, over the decode steps in between.
- raw: the model's forward pass in a loop on prebuilt inputs and attention metadata, argmax
  on the logits (what a step costs with no engine around it).
- floor: a decode step reads every weight once, so it cannot beat the time a memcpy of the
  weights' bytes takes (the bandwidth measured on the same thread, in the same run).
Everything runs on the engine's compute thread, so all three use the same OpenMP team. Each
is timed twice: wall time, and this process's CPU time (all threads: the engine's event loop
counts), which on a machine other jobs share says what the work cost.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import NamedTuple

import torch

from minipd.engine.engine import Engine
from minipd.engine.model_runner import ModelRunner
from minipd.engine.request import Request
from minipd.engine.sampling_params import SamplingParams
from minipd.engine.scheduler import ScheduledChunk

MEMCPY_ROUNDS = 3  # the fastest of these counts (the floor is a best case)


class Timing(NamedTuple):
    wall_s: float
    cpu_s: float
    forward_cpu_s: float = 0.0  # engine only: of `cpu_s`, the compute thread's time inside the model's forward


def _now() -> Timing:
    return Timing(time.perf_counter(), time.process_time())


def _per(start: Timing, end: Timing, count: int) -> Timing:
    return Timing((end.wall_s - start.wall_s) / count, (end.cpu_s - start.cpu_s) / count)


def prompts(batch: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(batch)]


async def engine_step(engine: Engine, batch_prompts: list[list[int]], output_len: int) -> Timing:
    """Also times the model's forward passes on the compute thread, so that what the engine
    adds around them (scheduling, inputs, sampling, streaming) is measured within the same
    steps, free of the drift between two separate runs."""
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    first_tokens: list[Timing] = []
    forward_cpu: list[tuple[float, float]] = []  # (end wall time, thread CPU time) of each forward
    model_forward = engine.model.forward

    def timed_forward(*args, **kwargs):
        start = time.thread_time()
        try:
            return model_forward(*args, **kwargs)
        finally:
            forward_cpu.append((time.perf_counter(), time.thread_time() - start))

    async def one(prompt: list[int]) -> None:
        async for out in engine.generate(prompt, params):
            if out.num_output_tokens == len(out.token_ids):  # the increment carrying the first token
                first_tokens.append(_now())

    engine.model.forward = timed_forward
    try:
        await asyncio.gather(*(one(p) for p in batch_prompts))
    finally:
        del engine.model.forward  # back to the class's method
    start, steps = max(first_tokens), output_len - 1
    per = _per(start, _now(), steps)
    decode_forward = sum(cpu for end, cpu in forward_cpu if end > start.wall_s)
    return per._replace(forward_cpu_s=decode_forward / steps)


def raw_step(engine: Engine, batch_prompts: list[list[int]], output_len: int) -> Timing:
    """Prefill untimed, then decode with inputs and attention metadata all built before timing.
    Call it on the engine's compute thread."""
    runner = ModelRunner(engine.model, engine.kv_pool)
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
            _, positions, meta, _ = runner._prepare([ScheduledChunk(r, 1, True) for r in requests])
            steps.append((positions, meta))
        index = torch.arange(len(requests), device=engine.device)
        next_ids = torch.tensor(first, device=engine.device)
        start = _now()
        for positions, meta in steps:
            logits = engine.model(next_ids, positions, engine.kv_pool, meta, index, runner.buffers)
            next_ids = logits.argmax(dim=-1)
        next_ids.tolist()  # wait for the device
        return _per(start, _now(), len(steps))
    finally:
        for r in requests:
            bm.free(r.block_ids)


def weight_bytes(model) -> int:
    """Bytes of the weights one decode step reads: every distinct parameter storage, except
    an untied input embedding (of which a step reads one row per token)."""
    skip = set() if model.config.tie_word_embeddings else {model.model.embed_tokens.weight.untyped_storage().data_ptr()}
    seen, total = skip, 0
    for p in model.parameters():
        storage = p.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


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
