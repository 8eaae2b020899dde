"""tracing: what `--otlp-traces-endpoint` costs at `bench.py slo`'s load, tracing on against off.

Two disaggregated clusters of the same shape (`--num-prefill` + `--num-decode`), one exporting
every request's trace to a local OTLP/HTTP sink (span_sink.py: it counts what it receives),
the other untraced, take turns at each rate of `bench.py slo`'s sweep (its workload, SLOs
and flags), so the drift of a shared machine hits both alike. Reported per rate: P90 TTFT
and ITL and the SLO attainment of each, and the ratio traced / untraced of the P90s and of
the goodput; the sink's posts and bytes say the spans did go out.

    python bench.py tracing --model small --json tracing.json
"""

from __future__ import annotations

import argparse

from benchmarks.loadgen.deployments import start_disaggregated
from benchmarks.loadgen.measure import Measured, measure
from benchmarks.loadgen.processes import Processes
from benchmarks.loadgen.rate_sweep import ratio, sweep_rates
from benchmarks.slo import slo_bench
from benchmarks.tracing.span_sink import SpanSink

OFF, ON = "tracing_off", "tracing_on"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    slo_bench.add_arguments(parser)  # the same workload, sweep and SLOs (its colocated flags unused)


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(slo_bench.QUICK)
    slos, builder, config, specs_at, server = slo_bench.sweep_setup(args)
    sink = SpanSink()
    try:
        with Processes() as processes:
            deployments = {
                OFF: start_disaggregated(processes, server, args.num_prefill, args.num_decode),
                ON: start_disaggregated(
                    processes,
                    server,
                    args.num_prefill,
                    args.num_decode,
                    router_flags=("--otlp-traces-endpoint", sink.endpoint),
                ),
            }

            def runner(mode: str):
                def run_at(rate: float, run_number: int) -> Measured:
                    urls = deployments[mode].urls
                    return measure(urls, specs_at(rate, run_number), builder, f"{mode}-{run_number}", config)

                return run_at

            sweeps = sweep_rates(args.rates, {mode: runner(mode) for mode in deployments}, slos, args.stop_below, 0)
    finally:
        sink.close()
    modes = {mode: {**sweep.as_json(slos), "launch": deployments[mode].launch} for mode, sweep in sweeps.items()}
    on, off = modes[ON], modes[OFF]
    shared = min(len(on["rates"]), len(off["rates"]))
    return {
        "model": args.model,
        "workload": args.dataset or args.workload,
        "torch_threads": args.torch_threads,
        "slo": {name: slo.as_ms() for name, slo in slos.items()},
        "modes": modes,
        "ratio_on_over_off": {
            "p90_ttft": [ratio(on["p90_ttft_ms"][i], off["p90_ttft_ms"][i]) for i in range(shared)],
            "p90_itl": [ratio(on["p90_itl_ms"][i], off["p90_itl_ms"][i]) for i in range(shared)],
            "goodput": {name: ratio(on["goodput_rps"][name], off["goodput_rps"][name]) for name in slos},
        },
        "exported": {"posts": sink.num_posts, "bytes": sink.num_bytes},
        "checks_failed": ["no span reached the sink"] if sink.num_posts == 0 else [],
    }


def print_table(result: dict) -> None:
    slo_bench.print_table(result)
    ratios = result["ratio_on_over_off"]
    for i, rate in enumerate(result["modes"][OFF]["rates"][: len(ratios["p90_ttft"])]):
        print(
            f"rate {rate:.2f}: traced / untraced P90 TTFT {ratios['p90_ttft'][i]:.3f}, "
            f"P90 ITL {ratios['p90_itl'][i]:.3f}"
        )
    goodputs = ", ".join(f"{name} {r:.3f}" for name, r in ratios["goodput"].items())
    print(f"goodput traced / untraced: {goodputs}")
    exported = result["exported"]
    print(f"spans exported: {exported['posts']} OTLP posts, {exported['bytes'] / 1e3:.1f} kB")
    for failure in result["checks_failed"]:
        print(f"CHECK FAILED: {failure}")
