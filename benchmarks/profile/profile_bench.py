"""profile: this engine's prefill and decode step times, fitted into a latency profile.

Runs the model forward through the engine's model runner on its compute thread (prepare,
forward, sample: one engine step without the scheduler), as `bench.py engine` does for its
raw loop, over a grid of prompt batches and decode batches x context lengths. Decode steps
run over KV blocks reserved but never written (the kernels read them all the same, and the
values cannot change the time), so no prefill is needed first. Every point is the median
of `--repeats` runs after a warm-up; the fit (non-negative least squares, DistServe's form)
and its R^2 and residuals go into the profile, which `--json` writes for the planner:

    python bench.py profile --model small --torch-threads 2 --json profile.json
    python -m minipd.ops.planner --profile profile.json ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

import torch

from benchmarks.loadgen.baseline_plots import plot_profile as plot  # noqa: F401 (bench.py --plot)
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.model_runner import ModelRunner
from minipd.engine.request import Request
from minipd.engine.sampling_params import SamplingParams
from minipd.engine.scheduler import ScheduledChunk
from minipd.ops.planner.kv_sizing import kv_bytes_per_token
from minipd.ops.planner.latency_model import (
    DecodeSample,
    PrefillSample,
    fit_decode,
    fit_prefill,
)
from minipd.ops.planner.latency_profile import LatencyProfile

PREFILL_LENS = (32, 64, 128, 256, 512)
PREFILL_BATCHES = (1, 2, 4)
DECODE_BATCHES = (1, 4, 8, 16, 32)
DECODE_CONTEXTS = (32, 128, 512)
QUICK = {
    "prefill_lens": (16, 64, 128),
    "prefill_batches": (1, 2),
    "decode_batches": (1, 4, 8),
    "decode_contexts": (16, 128),
    "repeats": 3,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small", help="preset or HF directory (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads before measuring")
    parser.add_argument("--repeats", type=int, default=5, help="median of this many runs per point")
    parser.add_argument("--num-blocks", type=int, default=2048, help="KV pool size, which sets the profile's capacity")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="a small grid and 3 repeats (for tests)")


def _request(i: int, length: int, bm, vocab: int, rng: random.Random) -> Request:
    request = Request(
        f"profile-{i}", [rng.randrange(vocab) for _ in range(length)], SamplingParams(max_tokens=1, temperature=0.0)
    )
    request.block_ids = bm.reserve(bm.blocks_for(length))
    return request


def _time_step(runner: ModelRunner, chunks: list[ScheduledChunk], repeats: int) -> float:
    runner.execute(chunks)  # warm-up (allocator, kernels)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.execute(chunks)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure(engine: Engine, grid: dict, repeats: int) -> tuple[list[PrefillSample], list[DecodeSample]]:
    """Runs on the compute thread."""
    runner, bm, vocab = engine.runner, engine.block_manager, engine.model_config.vocab_size
    rng = random.Random(0)
    prefill, decode = [], []
    for n in grid["prefill_lens"]:
        for batch in grid["prefill_batches"]:
            if n * batch > engine.config.scheduler.max_num_batched_tokens:
                continue
            requests = [_request(i, n, bm, vocab, rng) for i in range(batch)]
            try:
                seconds = _time_step(runner, [ScheduledChunk(r, n, True) for r in requests], repeats)
            finally:
                for r in requests:
                    bm.free(r.block_ids)
            prefill.append(PrefillSample([n] * batch, seconds))
    for context in grid["decode_contexts"]:
        for batch in grid["decode_batches"]:
            requests = [_request(i, context, bm, vocab, rng) for i in range(batch)]
            for r in requests:
                r.num_computed_tokens = context - 1  # the last token is the one this step decodes
            try:
                seconds = _time_step(runner, [ScheduledChunk(r, 1, True) for r in requests], repeats)
            finally:
                for r in requests:
                    bm.free(r.block_ids)
            decode.append(DecodeSample([context] * batch, seconds))
    return prefill, decode


def run(args: argparse.Namespace) -> dict:
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    grid = (
        dict(QUICK)
        if args.quick
        else {
            "prefill_lens": PREFILL_LENS,
            "prefill_batches": PREFILL_BATCHES,
            "decode_batches": DECODE_BATCHES,
            "decode_contexts": DECODE_CONTEXTS,
            "repeats": args.repeats,
        }
    )
    max_len = max(max(grid["prefill_lens"]), max(grid["decode_contexts"])) + 1
    config = EngineConfig.of(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        num_blocks=args.num_blocks,
        max_model_len=max(max_len, 64),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=False,
    )

    async def measure():
        async with Engine(config) as engine:
            samples = engine.run_on_compute_thread(_measure, engine, grid, grid["repeats"])
            return engine, samples

    engine, (prefill_samples, decode_samples) = asyncio.run(measure())
    prefill, prefill_fit = fit_prefill(prefill_samples)
    decode, decode_fit = fit_decode(decode_samples)
    c = engine.model_config
    profile = LatencyProfile(
        name=f"{args.model}-{args.dtype}-{args.device}",
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        threads=torch.get_num_threads() if args.device == "cpu" else None,
        num_layers=c.num_layers,
        kv_bytes_per_token=kv_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, args.dtype),
        kv_capacity_tokens=config.num_blocks * config.block_size,
        max_batched_tokens=config.scheduler.max_num_batched_tokens,
        max_num_seqs=config.scheduler.max_num_seqs,
        prefill=prefill,
        decode=decode,
        prefill_fit=prefill_fit,
        decode_fit=decode_fit,
        source="measured",
        notes=f"bench.py profile, medians of {grid['repeats']} runs, torch {torch.__version__}",
        prefill_samples=prefill_samples,
        decode_samples=decode_samples,
    )
    return json.loads(profile.to_json())  # exactly what LatencyProfile.load reads back


def print_table(result: dict) -> None:
    print(f"latency profile of {result['model']} ({result['dtype']}, {result['device']}, threads {result['threads']})")
    for part, terms in (
        ("prefill", ("s/step", "s/token", "s/token^2")),
        ("decode", ("s/step", "s/ctx token", "s/seq")),
    ):
        m, fit = result[part], result[f"{part}_fit"]
        coefs = "  ".join(f"{k}={m[k]:.3e} {unit}" for k, unit in zip("abc", terms))
        print(
            f"  {part:<8} {coefs}   R^2 {fit['r2']:.4f}, rmse {fit['rmse_s'] * 1e3:.3f} ms, "
            f"max error {fit['max_rel_error']:.1%} over {fit['num_samples']} points"
        )
    print(f"  KV {result['kv_bytes_per_token']} B/token, capacity {result['kv_capacity_tokens']} tokens")
    print("  (the JSON is a LatencyProfile with its samples: python -m minipd.ops.planner --profile FILE)")
