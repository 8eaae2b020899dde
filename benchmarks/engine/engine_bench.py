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
import math
import statistics

import torch

from benchmarks.engine import engine_decode, engine_kernels, engine_serving
from benchmarks.loadgen.baseline_plots import plot_engine as plot  # noqa: F401 (bench.py --plot)
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.model_loader import gguf_path
from minipd.models.gguf_file import read_gguf
from minipd.workload.lengths import LengthDist

BF16_BATCH = 8
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
        choices=["auto", "quantized", "dense"],
        help="a GGUF's 4-bit weights, as minipd's --weights (default: %(default)s)",
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


def _engine(args: argparse.Namespace, dtype: str, num_seqs: int, max_len: int, weights: str | None = None) -> Engine:
    blocks_per_seq = -(-max_len // BLOCK_SIZE)
    return Engine(
        EngineConfig.of(
            model=args.model,
            dtype=dtype,
            weights=weights or args.weights,
            block_size=BLOCK_SIZE,
            num_blocks=num_seqs * blocks_per_seq + 1,
            max_model_len=max_len,
            max_num_seqs=num_seqs,
            enable_prefix_caching=False,
            torch_threads=args.torch_threads,
        )
    )


async def _decode_part(args: argparse.Namespace, engine: Engine, fp32: Engine | None, dense: Engine | None) -> dict:
    """`dense`: the same model served dense, timed beside a quantized `engine` (else None)."""
    vocab = engine.model_config.vocab_size
    n_bytes = engine.run_on_compute_thread(engine_decode.weight_bytes, engine.model)
    rows: dict[int, dict[str, list[engine_decode.Timing]]] = {
        b: {"engine": [], "raw": [], "floor": [], "dense": []} for b in args.decode_batches
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
            warm = engine_decode.prompts(2, 16, engine.model_config.vocab_size)
            await engine_decode.engine_step(engine, warm, 4)
            fp32 = _engine(args, "float32", BF16_BATCH, max_len) if "dtype" in args.parts else None
            compare = "decode" in args.parts and engine.config.weights == "quantized"
            dense = _engine(args, args.dtype, max(args.decode_batches), max_len, "dense") if compare else None
            try:
                for other in (e for e in (fp32, dense) if e is not None):
                    await other.start()
                    await engine_decode.engine_step(other, warm, 4)
                if "decode" in args.parts or fp32 is not None:
                    result.update(await _decode_part(args, engine, fp32, dense))
            finally:
                for other in (e for e in (fp32, dense) if e is not None):
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


def _verdict(value: float, target: float, higher_is_better: bool) -> str:
    ok = value >= target if higher_is_better else value <= target
    return f"(target {'>=' if higher_is_better else '<='} {target}: {'met' if ok else 'MISSED'})"


def print_table(result: dict) -> None:
    t = result["targets"]
    weights = f"weights {result['weights']}, " if "weights" in result else ""
    print(f"engine benchmark, model={result['model']}, {result['dtype']}, {weights}{result['placement']}")
    if "serving_tok_s" in result:
        print(
            f"serving: {result['num_requests']} requests, prompts {result['prompt_len']}, outputs "
            f"{result['output_len']}, EOS ignored"
        )
        print(f"  {'':36} {'tok/s':>8} {'tok/CPU-s':>10}")
        print(
            f"  {'minipd engine (continuous batching)':36} {result['serving_tok_s']:8.1f} "
            f"{result['serving_cpu_tok_s']:10.1f}"
        )
        print(
            f"  {'HF generate, static batches of ' + str(result['hf_batch']):36} {result['hf_static_tok_s']:8.1f} "
            f"{result['hf_static_cpu_tok_s']:10.1f}"
        )
        print(
            f"  speedup_vs_hf_static {result['speedup_vs_hf_static']:.2f}x "
            f"{_verdict(result['speedup_vs_hf_static'], t['speedup_vs_hf_static'], True)}; "
            f"per CPU second {result['speedup_vs_hf_static_cpu']:.2f}x"
        )
    if "decode" in result:
        _print_decode(result)
    if "kernels" in result:
        print(
            f"one layer's projections (prepacked bf16 vs int4, {result['placement']}): "
            + ", ".join(
                f"batch {b} {k['dense_ms']:.3f} vs {k['int4_ms']:.3f} ms ({k['int4_vs_dense']:.2f}x)"
                for b, k in result["kernels"].items()
            )
        )
    if "bf16_speedup" in result:
        print(
            f"bf16 vs fp32 decode at batch {BF16_BATCH}: {result['bf16_tok_s']:.1f} vs {result['fp32_tok_s']:.1f} "
            f"tok/s, bf16_speedup {result['bf16_speedup']:.2f}x (by CPU time {result['bf16_speedup_cpu']:.2f}x) "
            f"{_verdict(result['bf16_speedup'], t['bf16_speedup'], True)}"
        )
    if not all(math.isfinite(v) for v in _numbers(result)):
        print("warning: some figures are not finite")


def _print_decode(result: dict) -> None:
    t = result["targets"]
    print(
        f"decode step (prompt {result['decode_prompt_len']}, {result['decode_output_len']} tokens), weights "
        f"{result['weight_bytes'] / 1e6:.0f} MB, memcpy {result['memcpy_gbps']:.1f} Gbit/s; wall ms (CPU ms):"
    )
    print(
        f"  {'batch':>5} {'engine':>15} {'raw loop':>15} {'floor':>15} {'engine/raw':>12} {'engine/floor':>12} "
        f"{'raw/floor':>11}"
    )
    for b, d in result["decode"].items():
        cells = [f"{d[f'{n}_ms']:.1f} ({d[f'{n}_cpu_ms']:.1f})" for n in ("engine_step", "raw_step", "floor")]
        ratios = [
            f"{d[n]:.2f} ({d[n + '_cpu']:.2f})" for n in ("overhead_vs_raw", "ratio_to_floor", "raw_ratio_to_floor")
        ]
        print(f"  {b:>5} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} {ratios[0]:>12} {ratios[1]:>12} {ratios[2]:>11}")
    print(
        f"  overhead_vs_raw (worst batch) {result['overhead_vs_raw']:.3f}, by CPU time "
        f"{result['overhead_vs_raw_cpu']:.3f} {_verdict(result['overhead_vs_raw'], t['overhead_vs_raw'], False)}"
    )
    print(
        "  engine CPU per step / its own forward passes' CPU: "
        + ", ".join(f"batch {b} {d['engine_vs_its_forward_cpu']:.3f}" for b, d in result["decode"].items())
    )
    print(
        f"  ratio_to_floor (batch {result['ratio_to_floor_batch']}) {result['ratio_to_floor']:.2f}, by CPU time "
        f"{result['ratio_to_floor_cpu']:.2f} {_verdict(result['ratio_to_floor'], t['ratio_to_floor'], False)}"
    )
    if "dense_weight_bytes" in result:
        print(
            f"  quantized vs dense ({result['dense_weight_bytes'] / 1e6:.0f} MB) engine step, back to back: "
            + ", ".join(
                f"batch {b} {d['engine_step_ms']:.1f} vs {d['dense_engine_step_ms']:.1f} ms, "
                f"{d['quantized_vs_dense']:.2f}x (CPU {d['quantized_vs_dense_cpu']:.2f}x)"
                for b, d in result["decode"].items()
            )
        )
    resident = result["resident_weight_bytes"]
    gguf = result.get("gguf_tensor_bytes")
    print(
        f"  resident weights {resident['weights'] / 1e6:.1f} MB"
        + (f" ({resident['weights'] / gguf:.2f}x the GGUF file's {gguf / 1e6:.1f} MB of tensors)" if gguf else "")
        + f", plus {resident['prepacked'] / 1e6:.1f} MB of copies prepacked for oneDNN's bf16 matmuls"
    )


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    return []
