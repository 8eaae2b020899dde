"""viewers: what the router's dashboard (`GET /dashboard/events`) costs, with viewers open against none.

1. Router CPU (router_cpu.py): a real `minipd --role router` with `--num-instances` fake
   instances registered (real handshake and Register, GetStats answered; no engine), its CPU
   over `--window-s` windows from /proc/PID/stat, alternating no viewer and `--num-viewers`
   SSE viewers, `--repeats` of each; medians as % of one core, and the difference.
2. Latency at `bench.py slo`'s load: one real disaggregated cluster (`--num-prefill` +
   `--num-decode`, slo's workload, sweep and SLOs) serves every rate twice, in turns, with no
   viewer and with `--num-viewers` viewers reading the stream; reported are P90 TTFT and ITL
   of each and the ratios viewed / unviewed.
Every viewer counts the snapshot events it received, so the JSON shows the streams were live.

    python bench.py viewers --json viewers.json --plot viewers.png
"""

from __future__ import annotations

import argparse

from benchmarks.loadgen.deployments import start_disaggregated
from benchmarks.loadgen.measure import Measured, measure
from benchmarks.loadgen.plotting import save, subplots
from benchmarks.loadgen.processes import Processes
from benchmarks.loadgen.rate_sweep import ratio, sweep_rates
from benchmarks.slo import slo_bench
from benchmarks.viewers.router_cpu import CpuOptions, measure_router_cpu
from benchmarks.viewers.sse_viewer import SseViewer

UNVIEWED, VIEWED = "no_viewer", "viewers"
QUICK_CPU = {"window_s": 3.0, "repeats": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    slo_bench.add_arguments(parser)  # part 2: the same workload, sweep and SLOs (its colocated flags unused)
    g = parser.add_argument_group("dashboard viewers")
    g.add_argument("--num-viewers", type=int, default=2, help="dashboard streams open while viewed (default 2)")
    g.add_argument("--num-instances", type=int, default=64, help="fake instances registered for part 1 (default 64)")
    g.add_argument("--window-s", type=float, default=10.0, help="one CPU measurement window (default 10 s)")
    g.add_argument("--repeats", type=int, default=5, help="CPU windows of each kind, alternating (default 5)")


def _check(args: argparse.Namespace) -> None:
    for name in ("num_viewers", "num_instances", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if not args.window_s > 0:
        raise ValueError(f"--window-s: must be positive, got {args.window_s}")


def _latency(args: argparse.Namespace) -> dict:
    slos, builder, config, specs_at, server = slo_bench.sweep_setup(args)
    snapshots: list[int] = []
    with Processes() as processes:
        deployment = start_disaggregated(processes, server, args.num_prefill, args.num_decode)
        url = deployment.urls[0]

        def runner(mode: str):
            def run_at(rate: float, run_number: int) -> Measured:
                viewers = [SseViewer(url, None) for _ in range(args.num_viewers if mode == VIEWED else 0)]
                try:
                    return measure(deployment.urls, specs_at(rate, run_number), builder, f"{mode}-{run_number}", config)
                finally:
                    for viewer in viewers:
                        viewer.close()
                    snapshots.extend(v.num_snapshots for v in viewers)

            return run_at

        sweeps = sweep_rates(args.rates, {mode: runner(mode) for mode in (UNVIEWED, VIEWED)}, slos, args.stop_below, 0)
    modes = {mode: {**sweep.as_json(slos), "launch": deployment.launch} for mode, sweep in sweeps.items()}
    on, off = modes[VIEWED], modes[UNVIEWED]
    shared = min(len(on["rates"]), len(off["rates"]))
    return {
        "slo": {name: slo.as_ms() for name, slo in slos.items()},
        "modes": modes,
        "ratio_viewed_over_unviewed": {
            "p90_ttft": [ratio(on["p90_ttft_ms"][i], off["p90_ttft_ms"][i]) for i in range(shared)],
            "p90_itl": [ratio(on["p90_itl_ms"][i], off["p90_itl_ms"][i]) for i in range(shared)],
        },
        "snapshots_per_viewer": snapshots,
    }


def run(args: argparse.Namespace) -> dict:
    _check(args)
    if args.quick:
        vars(args).update(slo_bench.QUICK | QUICK_CPU)
    cpu = measure_router_cpu(CpuOptions(args.num_instances, args.num_viewers, args.window_s, args.repeats))
    latency = _latency(args)
    failed = [
        f"{part}: a viewer received no snapshot"
        for part, counts in (("router_cpu", cpu["snapshots_per_viewer"]), ("latency", latency["snapshots_per_viewer"]))
        if not counts or min(counts) == 0
    ]
    return {
        "model": args.model,
        "workload": args.dataset or args.workload,
        "torch_threads": args.torch_threads,
        "router_cpu": cpu,
        **latency,
        "checks_failed": failed,
    }


def print_table(result: dict) -> None:
    cpu = result["router_cpu"]
    print(
        f"router CPU, {cpu['num_instances']} fake instances, median of {cpu['repeats']} x {cpu['window_s']:g} s: "
        f"{cpu['cpu_pct_no_viewer']:.2f}% of a core with no viewer, {cpu['cpu_pct_viewers']:.2f}% with "
        f"{cpu['num_viewers']} viewers ({cpu['cpu_pct_difference']:+.2f} points); snapshots per viewer "
        f"{cpu['snapshots_per_viewer']}, {cpu['kb_per_snapshot']:.1f} kB each"
    )
    slo_bench.print_table(result)
    ratios = result["ratio_viewed_over_unviewed"]
    for i, rate in enumerate(result["modes"][UNVIEWED]["rates"][: len(ratios["p90_ttft"])]):
        itl = ratios["p90_itl"][i]
        print(
            f"rate {rate:.2f}: viewed / unviewed P90 TTFT {ratios['p90_ttft'][i]:.3f}, "
            f"P90 ITL {'n/a' if itl is None else f'{itl:.3f}'}"
        )
    print(f"snapshots per viewer during the load: {result['snapshots_per_viewer']}")
    for failure in result["checks_failed"]:
        print(f"CHECK FAILED: {failure}")


def plot(result: dict, path: str) -> None:
    fig, (cpu_ax, ttft_ax, itl_ax) = subplots(ncols=3, width=4.5)
    cpu = result["router_cpu"]
    labels = ["no viewer", f"{cpu['num_viewers']} viewers"]
    samples = [cpu["cpu_pct_samples"]["0"], cpu["cpu_pct_samples"][str(cpu["num_viewers"])]]
    cpu_ax.boxplot(samples)
    cpu_ax.set_xticks([1, 2], labels)
    cpu_ax.set_ylabel("router CPU, % of one core")
    cpu_ax.set_title(f"router, {cpu['num_instances']} fake instances")
    for mode, label in ((UNVIEWED, "no viewer"), (VIEWED, f"{cpu['num_viewers']} viewers")):
        m = result["modes"][mode]
        ttft_ax.plot(m["rates"], m["p90_ttft_ms"], marker="o", label=label)
        itl_ax.plot(m["rates"], m["p90_itl_ms"], marker="o", label=label)
    for ax, name in ((ttft_ax, "P90 TTFT"), (itl_ax, "P90 ITL")):
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} at slo's load, 1P:1D tiny")
        ax.legend()
    save(fig, path)
