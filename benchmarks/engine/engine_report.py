"""The engine experiment's table: serving throughput, decode steps against the raw loop and
the floor, the kernels' comparison and bf16 vs fp32, each ratio beside its target."""

from __future__ import annotations

import math

BF16_BATCH = 8  # the batch of the bf16-vs-fp32 part, which engine_bench.py runs at it


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
        vnni = all("vnni_ms" in k for k in result["kernels"].values())
        print(
            f"one layer's projections (prepacked bf16 vs torch int4{' vs vnni' if vnni else ''}, "
            f"{result['placement']}): "
            + ", ".join(
                f"batch {b} {k['dense_ms']:.3f} vs {k['int4_ms']:.3f}"
                + (f" vs {k['vnni_ms']:.3f}" if vnni else "")
                + f" ms ({k['int4_vs_dense']:.2f}x"
                + (f", {k['vnni_vs_dense']:.2f}x)" if vnni else ")")
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
    if all("vnni_vs_torch_kernel" in d for d in result["decode"].values()):
        print(
            f"  {result['quantized_kernel']} vs torch's int4 kernel, same weights, engine step, back to back: "
            + ", ".join(
                f"batch {b} {d['engine_step_ms']:.1f} vs {d['torch_kernel_engine_step_ms']:.1f} ms, "
                f"{d['vnni_vs_torch_kernel']:.2f}x (CPU {d['vnni_vs_torch_kernel_cpu']:.2f}x)"
                for b, d in result["decode"].items()
            )
        )
    resident = result["resident_weight_bytes"]
    gguf = result.get("gguf_tensor_bytes")
    print(
        f"  resident weights {resident['weights'] / 1e6:.1f} MB"
        + (f" ({resident['weights'] / gguf:.2f}x the GGUF file's {gguf / 1e6:.1f} MB of tensors)" if gguf else "")
        + f", plus {resident['prepacked'] / 1e6:.1f} MB of copies prepacked for oneDNN's bf16 matmuls"
        + (
            f", plus {resident['dense_copy'] / 1e6:.1f} MB of dense copies of the 4-bit projections (prefill rows)"
            if resident.get("dense_copy")
            else ""
        )
    )


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    return []
