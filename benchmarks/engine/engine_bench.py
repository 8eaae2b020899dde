"""engine: serving throughput against HF static batching, decode step time against its floor, bf16 vs fp32.

1. Serving throughput (`serving_tok_s`, `hf_static_tok_s`, `speedup_vs_hf_static`, target
   >= 3): an offline workload of `--num-requests` requests of mixed lengths (prompts
   `--prompt-len`, outputs `--output-len`, fixed seed, EOS ignored) through minipd's engine,
   and through `transformers`' `generate` in static batches of `--hf-batch` (padded), on the
   same weights and dtype, in the same run (see engine_serving.py).
2. Decode step at each `--decode-batches` size (see engine_decode.py): the engine's step
   time against the raw model loop (`overhead_vs_raw`, target <= 1.1) and against the
   weight-streaming floor, weight bytes / memcpy bandwidth measured next to it
   (`ratio_to_floor`, target <= 1.5 at batch 1); and, within the engine's own steps, its
   CPU time over that of the forward passes it ran (`engine_vs_its_forward_cpu`). A model
   served quantized (`--weights`, see minipd's flag) is timed against the same file served
   dense, back to back in each repeat (`quantized_vs_dense`, engine step time quantized /
   dense: below 1 is faster), and its floor counts the bytes it reads; the resident weight
   bytes are reported beside the GGUF file's tensor bytes.
3. bf16 vs fp32: the engine's decode tokens/s at batch `BF16_BATCH` in both dtypes
   (`bf16_speedup`, target >= 2).
4. Kernels (bfloat16 on the CPU): one layer's projections at each `--decode-batches` size,
   torch's int4 kernel against the prepacked bf16 matmul (`kernels`, see engine_kernels.py).

Ratios are medians of per-repeat ratios, each repeat measuring both sides back to back, so
drift on a shared machine hits both alike; every figure is also given by this process's CPU
time (`*_cpu`), which other jobs on the machine do not inflate the way they inflate wall
time. Everything runs on one engine compute thread per engine, with `--torch-threads`
threads (default: minipd's placement, one core left over).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import torch

from benchmarks.engine import engine_decode, engine_kernels, engine_serving
from benchmarks.engine.engine_report import BF16_BATCH, print_table  # noqa: F401 (bench.py prints with print_table)
from benchmarks.loadgen.baseline_plots import plot_engine as plot  # noqa: F401 (bench.py --plot)
from minipd.engine.config import QUANTIZED_KERNEL_CHOICES, WEIGHTS_CHOICES
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.model_loader import gguf_path
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.gguf.gguf_loader import has_q4_tensors
from minipd.models.weights.quantized_linear import INT8_KERNELS
from minipd.ops.workload.lengths import LengthDist

PARTS = ("serving", "decode", "dtype", "kernels")  # 1. to 4. above
TARGETS = {"speedup_vs_hf_static": 3.0, "overhead_vs_raw": 1.1, "ratio_to_floor": 1.5, "bf16_speedup": 2.0}
QUICK = {
    "num_requests": 8,
    "prompt_len": "uniform:16:64",
    "output_len": "uniform:4:16",
    "decode_prompt_len": 32,
    "decode_output_len": 8,
    "repeats": 1,
}
BLOCK_SIZE = 16
MS = 1e3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="model for every part (default: %(default)s)")
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float32", "float16"],
        help="dtype of the serving and decode-step parts (default: %(default)s)",
    )
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--prompt-len", default="uniform:32:512", help="prompt lengths (default: %(default)s)")
    parser.add_argument("--output-len", default="uniform:16:256", help="output lengths (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hf-batch", type=int, default=8, help="static batch size of HF generate (default: 8)")
    parser.add_argument(
        "--weights",
        default="auto",
        choices=list(WEIGHTS_CHOICES),
        help="a GGUF's 4-bit weights, as minipd's --weights (default: %(default)s)",
    )
    parser.add_argument(
        "--quantized-kernel",
        default="auto",
        choices=list(QUANTIZED_KERNEL_CHOICES),
        help="as minipd's --quantized-kernel; with vnni or avx2 in bfloat16, the decode steps are also timed with "
        "torch's kernel beside them (default: %(default)s)",
    )
    parser.add_argument("--decode-batches", type=int, nargs="+", default=[1, BF16_BATCH])
    parser.add_argument("--decode-prompt-len", type=int, default=128)
    parser.add_argument("--decode-output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the decode parts (default: 5)")
    parser.add_argument("--torch-threads", type=int, default=None, help="(default: minipd's placement)")
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts to run (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (small workload, one repeat)")


def _engine(
    args: argparse.Namespace,
    dtype: str,
    num_seqs: int,
    max_len: int,
    weights: str | None = None,
    quantized_kernel: str | None = None,
) -> Engine:
    blocks_per_seq = -(-max_len // BLOCK_SIZE)
    return Engine(
        EngineConfig.of(
            model=args.model,
            dtype=dtype,
            weights=weights or args.weights,
            quantized_kernel=quantized_kernel or args.quantized_kernel,
            block_size=BLOCK_SIZE,
            num_blocks=num_seqs * blocks_per_seq + 1,
            max_model_len=max_len,
            max_num_seqs=num_seqs,
            enable_prefix_caching=False,
            torch_threads=args.torch_threads,
        )
    )


async def _decode_part(
    args: argparse.Namespace, engine: Engine, fp32: Engine | None, dense: Engine | None, torch_kernel: Engine | None
) -> dict:
    """`dense`: the same model served dense, timed beside a quantized `engine` (else None);
    `torch_kernel`: the same weights multiplied by torch's int4 kernel, beside a vnni `engine`."""
    vocab = engine.model_config.vocab_size
    n_bytes = engine.run_on_compute_thread(engine_decode.weight_bytes, engine.model)
    rows: dict[int, dict[str, list[engine_decode.Timing]]] = {
        b: {"engine": [], "raw": [], "floor": [], "dense": [], "torch": []} for b in args.decode_batches
    }
    speed: dict[str, list[engine_decode.Timing]] = {"bf16": [], "fp32": []}
    length = args.decode_output_len
    batches = args.decode_batches if "decode" in args.parts else []

    def floor() -> engine_decode.Timing:
        return engine.run_on_compute_thread(engine_decode.memcpy, n_bytes)

    for r in range(args.repeats):
        for b in batches:
            batch = engine_decode.prompts(b, args.decode_prompt_len, vocab, seed=r)
            # The floor is timed right before and after the engine's steps (the faster of the
            # two counts), and the raw loop goes first on odd repeats: the memory bandwidth
            # drifts over seconds here, and whichever part ran in a slow spell would carry it.
            if r % 2:
                rows[b]["raw"].append(engine.run_on_compute_thread(engine_decode.raw_step, engine, batch, length))
            before = floor()
            rows[b]["engine"].append(await engine_decode.engine_step(engine, batch, length))
            rows[b]["floor"].append(min(before, floor()))
            if not r % 2:
                rows[b]["raw"].append(engine.run_on_compute_thread(engine_decode.raw_step, engine, batch, length))
            if dense is not None:  # right after the quantized engine's steps, which the floor brackets
                rows[b]["dense"].append(await engine_decode.engine_step(dense, batch, length))
            if torch_kernel is not None:
                rows[b]["torch"].append(await engine_decode.engine_step(torch_kernel, batch, length))
        if fp32 is not None:
            batch = engine_decode.prompts(BF16_BATCH, args.decode_prompt_len, vocab, seed=r)
            for dtype, e in (("bf16", engine), ("fp32", fp32)) if r % 2 == 0 else (("fp32", fp32), ("bf16", engine)):
                speed[dtype].append(await engine_decode.engine_step(e, batch, length))
    out: dict = {}
    if batches:
        out["decode"] = {b: _decode_row(m) for b, m in rows.items()}
        out["weight_bytes"] = n_bytes
        out["resident_weight_bytes"] = engine.run_on_compute_thread(engine_decode.resident_weight_bytes, engine.model)
        if dense is not None:
            out["dense_weight_bytes"] = dense.run_on_compute_thread(engine_decode.weight_bytes, dense.model)
        out["memcpy_gbps"] = n_bytes / statistics.median(t.wall_s for t in rows[batches[0]]["floor"]) * 8 / 1e9
    if fp32 is not None:
        out["bf16_tok_s"] = BF16_BATCH / statistics.median(t.wall_s for t in speed["bf16"])
        out["fp32_tok_s"] = BF16_BATCH / statistics.median(t.wall_s for t in speed["fp32"])
        out["bf16_speedup"] = _paired(speed["fp32"], speed["bf16"], "wall_s")
        out["bf16_speedup_cpu"] = _paired(speed["fp32"], speed["bf16"], "cpu_s")
    return out


def _paired(num: list, den: list, clock: str) -> float:
    """The median of per-repeat ratios num/den on one clock (each pair measured back to back)."""
    return statistics.median(getattr(a, clock) / getattr(b, clock) for a, b in zip(num, den))


def _decode_row(m: dict[str, list]) -> dict:
    row = {}
    for clock, suffix in (("wall_s", ""), ("cpu_s", "_cpu")):
        for part, name in (("engine", "engine_step"), ("raw", "raw_step"), ("floor", "floor")):
            row[f"{name}{suffix}_ms"] = statistics.median(getattr(t, clock) for t in m[part]) * MS
        row[f"overhead_vs_raw{suffix}"] = _paired(m["engine"], m["raw"], clock)
        row[f"ratio_to_floor{suffix}"] = _paired(m["engine"], m["floor"], clock)
        row[f"raw_ratio_to_floor{suffix}"] = _paired(m["raw"], m["floor"], clock)
    if m["dense"]:
        for clock, suffix in (("wall_s", ""), ("cpu_s", "_cpu")):
            row[f"dense_engine_step{suffix}_ms"] = statistics.median(getattr(t, clock) for t in m["dense"]) * MS
            row[f"quantized_vs_dense{suffix}"] = _paired(m["engine"], m["dense"], clock)
    if m["torch"]:
        for clock, suffix in (("wall_s", ""), ("cpu_s", "_cpu")):
            row[f"torch_kernel_engine_step{suffix}_ms"] = statistics.median(getattr(t, clock) for t in m["torch"]) * MS
            row[f"vnni_vs_torch_kernel{suffix}"] = _paired(m["engine"], m["torch"], clock)
    # What the engine adds to its own forward passes, within the same steps (CPU time).
    row["engine_vs_its_forward_cpu"] = statistics.median(t.cpu_s / t.forward_cpu_s for t in m["engine"])
    return row


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    prompt_len, output_len = LengthDist.parse(args.prompt_len), LengthDist.parse(args.output_len)
    max_len = max(prompt_len.high + output_len.high, args.decode_prompt_len + args.decode_output_len) + BLOCK_SIZE
    result: dict = {
        "model": args.model,
        "dtype": args.dtype,
        "num_requests": args.num_requests,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "hf_batch": args.hf_batch,
        "decode_prompt_len": args.decode_prompt_len,
        "decode_output_len": args.decode_output_len,
        "repeats": args.repeats,
        "targets": TARGETS,
    }
    path = gguf_path(args.model)
    if path is not None:
        result["gguf_tensor_bytes"] = sum(t.num_bytes for t in read_gguf(path).tensors.values())

    async def measure() -> None:
        num_seqs = max(args.num_requests, *args.decode_batches)
        async with _engine(args, args.dtype, num_seqs, max_len) as engine:
            result["torch_threads"] = engine.placement.torch_threads
            result["placement"] = engine.placement.describe()
            result["weights"] = engine.config.weights
            result["quantized_kernel"] = engine.model.quantized_kernel
            warm = engine_decode.prompts(2, 16, engine.model_config.vocab_size)
            await engine_decode.engine_step(engine, warm, 4)
            fp32 = _engine(args, "float32", BF16_BATCH, max_len) if "dtype" in args.parts else None
            compare = "decode" in args.parts and engine.config.weights in ("quantized", "mixed")
            dense = _engine(args, args.dtype, max(args.decode_batches), max_len, "dense") if compare else None
            # torch's int4 kernel takes bfloat16 and Q4_0/Q4_1 only (not a K-quant file); the key stays
            # vnni_vs_torch_kernel for either int8 kernel
            vnni = compare and engine.model.quantized_kernel in INT8_KERNELS and args.dtype == "bfloat16"
            vnni = vnni and path is not None and has_q4_tensors(read_gguf(path))
            torch_kernel = _engine(args, args.dtype, max(args.decode_batches), max_len, None, "torch") if vnni else None
            others = [e for e in (fp32, dense, torch_kernel) if e is not None]
            try:
                for other in others:
                    await other.start()
                    await engine_decode.engine_step(other, warm, 4)
                if "decode" in args.parts or fp32 is not None:
                    result.update(await _decode_part(args, engine, fp32, dense, torch_kernel))
            finally:
                for other in others:
                    await other.close()
            if "kernels" in args.parts and engine.dtype == torch.bfloat16 and engine.device.type == "cpu":
                rounds = 3 if args.quick else 15
                kernels = engine.run_on_compute_thread(
                    engine_kernels.layer_matmuls, engine.model_config, args.decode_batches, rounds
                )
                result["kernels"] = kernels
            if "serving" in args.parts:
                requests = engine_serving.make_requests(
                    args.num_requests, prompt_len, output_len, engine.model_config.vocab_size, args.seed
                )
                ours = await engine_serving.engine_tok_s(engine, requests)
                model = engine.run_on_compute_thread(engine_serving.hf_model, engine)
                theirs = engine.run_on_compute_thread(engine_serving.hf_static_tok_s, model, requests, args.hf_batch)
                result.update(
                    serving_tok_s=ours.tok_s,
                    hf_static_tok_s=theirs.tok_s,
                    speedup_vs_hf_static=ours.tok_s / theirs.tok_s,
                    serving_cpu_tok_s=ours.cpu_tok_s,
                    hf_static_cpu_tok_s=theirs.cpu_tok_s,
                    speedup_vs_hf_static_cpu=ours.cpu_tok_s / theirs.cpu_tok_s,
                )

    asyncio.run(measure())
    if "decode" in result:
        first = args.decode_batches[0]
        for suffix in ("", "_cpu"):
            result[f"overhead_vs_raw{suffix}"] = max(d[f"overhead_vs_raw{suffix}"] for d in result["decode"].values())
            result[f"ratio_to_floor{suffix}"] = result["decode"][first][f"ratio_to_floor{suffix}"]
        result["ratio_to_floor_batch"] = first
    return result
