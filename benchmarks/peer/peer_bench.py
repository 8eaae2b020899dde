"""peer: the same workloads against minipd and another OpenAI-compatible server, as ratios.

    python bench.py peer --peer-url http://127.0.0.1:8080 --model smollm2 --json peer.json --plot peer.png
    python bench.py peer --peer-url http://127.0.0.1:8080 --minipd-url http://127.0.0.1:8000
    python bench.py peer --peer-binary build/bin/llama-server --model smollm2 --cpus 0 --torch-threads 1

Both servers get the same requests (same workload, seed and concurrency) in one run, alternating
minipd, peer, minipd, peer ... per repeat so a slow spell of the machine hits both. Each figure
(median ITL, output tok/s, median TTFT per workload and concurrency) is the median over the
repeats, reported as minipd/peer (ITL and TTFT: below 1 is minipd faster; tok/s: above 1).
Without `--minipd-url` the bench starts `minipd --role both` itself, pinned to `--cpus` with
`--torch-threads` threads (start the peer pinned the same way, e.g. `taskset -c 1 llama-server`;
docs/benchmarks.md says how to build and run llama-server). `--peer-binary` starts the peer
itself instead, on the same GGUF file, cores and thread count as minipd (benchmarks/peer/
peer_server.py), and stops it at the end. Without a peer nothing runs: the bench says why and
exits 2. `--quick` runs a few requests on the tiny model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmarks.loadgen import options
from benchmarks.loadgen.deployments import start_server
from benchmarks.loadgen.measure import Measured, measure
from benchmarks.loadgen.plotting import save, subplots
from benchmarks.loadgen.processes import Processes, minipd_command
from benchmarks.peer.peer_server import model_file, start_peer
from minipd.ops.workload import WORKLOADS, ArrivalProcess, LengthDist

NO_PEER = (
    "peer: nothing ran: no peer given. Pass --peer-url URL of an OpenAI-compatible server (e.g. llama.cpp's "
    "llama-server; docs/benchmarks.md says how to build it) to compare minipd against it."
)
FIGURES = (  # name in the JSON, unit, True when higher is better
    ("median_itl_ms", "ms", False),
    ("output_tok_s", "tok/s", True),
    ("median_ttft_ms", "ms", False),
)
FIGURE_TITLES = {  # a plot's panel titles
    "median_itl_ms": "median inter-token latency",
    "output_tok_s": "output tokens/s",
    "median_ttft_ms": "median time to first token",
}
SIDES = ("minipd", "peer")
MS_PER_S = 1e3
QUICK = {
    "model": "tiny",
    "workloads": ["decode-heavy", "prefill-heavy"],  # mixed takes no length overrides
    "concurrencies": [1, 2],
    "num_prompts": 4,
    "repeats": 1,
    "prompt_len": LengthDist.uniform(16, 32),
    "output_len": LengthDist.fixed(8),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_workload_arguments(parser, with_rate=False)
    for action in parser._actions:  # one workload per run does not apply here: --workloads takes several
        if "--workload" in action.option_strings:
            action.help = argparse.SUPPRESS
    options.add_client_arguments(parser)
    options.add_server_arguments(parser)
    g = parser.add_argument_group("peer comparison")
    g.add_argument("--peer-url", default=None, help="the OpenAI-compatible server compared against")
    g.add_argument(
        "--peer-binary",
        default=None,
        metavar="PATH",
        help="instead of --peer-url: start this llama-server on --model's GGUF file, pinned to --peer-cpus with "
        "--torch-threads threads, and stop it at the end",
    )
    g.add_argument(
        "--peer-model", default=None, metavar="FILE", help="GGUF file of the started peer (default: --model's)"
    )
    g.add_argument("--peer-cpus", default=None, help="cores of the started peer (default: --cpus, as minipd's)")
    g.add_argument(
        "--peer-slots", type=int, default=None, help="parallel slots of the started peer (default: top concurrency)"
    )
    g.add_argument("--minipd-url", default=None, help="a running minipd instead of one started by the bench")
    g.add_argument(
        "--workloads", nargs="+", choices=WORKLOADS, default=["decode-heavy", "mixed"], help="(default: %(default)s)"
    )
    g.add_argument(
        "--concurrencies", nargs="+", type=int, default=[1, 8], help="requests in flight (default: %(default)s)"
    )
    g.add_argument("--repeats", type=int, default=3, help="runs per side and cell, alternating (default: 3)")
    g.add_argument("--cpus", default="0", help="--cpus of the minipd it starts (default: %(default)s)")


def _figures(measured: Measured) -> dict:
    summary = measured.summary
    return {
        "median_itl_ms": summary.itl.median * MS_PER_S,
        "output_tok_s": summary.output_throughput,
        "median_ttft_ms": summary.ttft.median * MS_PER_S,
        "completed": summary.completed,
        "failed": summary.failed,
        "num_requests": summary.num_requests,
    }


def _median_figures(runs: list[dict]) -> dict:
    merged = {name: statistics.median(r[name] for r in runs) for name, _, _ in FIGURES}
    for count in ("completed", "failed", "num_requests"):
        merged[count] = sum(r[count] for r in runs)
    return merged


def _start_minipd(processes: Processes, args: argparse.Namespace, specs: list) -> str:
    opts = options.server_options(args, specs)
    argv = [*minipd_command(), "--role", "both", "--port", "0", "--cpus", args.cpus, *opts.engine_flags()]
    return start_server(processes, "minipd-both", argv)


def run(args: argparse.Namespace) -> dict:
    if not args.peer_url and not args.peer_binary:
        print(NO_PEER, file=sys.stderr)
        raise SystemExit(2)  # a missing flag, as argparse exits for one
    if args.peer_url and args.peer_binary:
        print("peer: give --peer-url or --peer-binary, not both", file=sys.stderr)
        raise SystemExit(2)
    if args.quick:
        vars(args).update(QUICK)
    if args.repeats < 1 or min(args.concurrencies) < 1:
        raise ValueError("--repeats and --concurrencies must be at least 1")
    peer_model = model_file(args.peer_model or args.model) if args.peer_binary else None
    num_prompts = args.num_prompts or 16
    builder = options.prompt_builder(args)
    cells = []
    with Processes() as processes:
        every_spec = [
            spec
            for w in args.workloads
            for spec in options.workload(
                argparse.Namespace(**{**vars(args), "workload": w}),
                ArrivalProcess.fixed_concurrency(1),
                num_prompts,
                builder,
            )
        ]
        minipd_url = args.minipd_url or _start_minipd(processes, args, every_spec)
        peer_url = args.peer_url or start_peer(
            processes,
            args.peer_binary,
            peer_model,
            args.peer_cpus or args.cpus,
            args.torch_threads,
            args.peer_slots or max(args.concurrencies),
            options.server_options(args, every_spec).max_model_len,
        )
        urls = {"minipd": minipd_url.rstrip("/"), "peer": peer_url.rstrip("/")}
        for workload in args.workloads:
            wargs = argparse.Namespace(**{**vars(args), "workload": workload})
            for concurrency in args.concurrencies:
                specs = options.workload(wargs, ArrivalProcess.fixed_concurrency(concurrency), num_prompts, builder)
                runs: dict[str, list[dict]] = {side: [] for side in SIDES}
                for repeat in range(args.repeats):
                    for side in SIDES:  # alternating, so both see the same spells of the machine
                        tag = f"peer-{workload}-c{concurrency}-{side}-r{repeat}"
                        config = options.runner_config(args, concurrency)
                        runs[side].append(_figures(measure([urls[side]], specs, builder, tag, config)))
                sides = {side: _median_figures(runs[side]) for side in SIDES}
                ratios = {
                    name: sides["minipd"][name] / sides["peer"][name] if sides["peer"][name] else float("nan")
                    for name, _, _ in FIGURES
                }
                cells.append(
                    {
                        "workload": workload,
                        "concurrency": concurrency,
                        "num_prompts": len(specs),
                        "repeats": args.repeats,
                        **sides,
                        "runs": runs,
                        "ratio": ratios,
                    }
                )
    return {
        "minipd_url": urls["minipd"],
        "peer_url": urls["peer"],
        "minipd_started": args.minipd_url is None,
        "peer_started": args.peer_binary,
        "peer_cpus": (args.peer_cpus or args.cpus) if args.peer_binary else None,
        "peer_model": str(peer_model) if peer_model else None,
        "model": args.model,
        "cpus": args.cpus if args.minipd_url is None else None,
        "seed": args.seed,
        "ratio_means": "minipd / peer: ITL and TTFT below 1 and tok/s above 1 are minipd better",
        "cells": cells,
    }


def peer_name(result: dict) -> str:
    """The peer as its user knows it: the binary the bench started, else its URL."""
    return Path(result["peer_started"]).name if result.get("peer_started") else result["peer_url"]


def print_table(result: dict) -> None:
    print(f"minipd {result['minipd_url']} vs peer {result['peer_url']}; ratios are minipd / peer")
    header = f"{'workload':<14}{'conc':>5}"
    for name, _, _ in FIGURES:
        header += f"{name + ' minipd':>22}{'peer':>10}{'ratio':>8}"
    print(header)
    for cell in result["cells"]:
        line = f"{cell['workload']:<14}{cell['concurrency']:>5}"
        for name, _, _ in FIGURES:
            line += f"{cell['minipd'][name]:>22.2f}{cell['peer'][name]:>10.2f}{cell['ratio'][name]:>8.2f}"
        print(line)


def plot(result: dict, path: str) -> None:
    """One panel per figure: the minipd/peer ratio of each workload and concurrency, 1 marked."""
    fig, axes = subplots(ncols=len(FIGURES), width=4.5)
    labels = [f"{c['workload']}\nc={c['concurrency']}" for c in result["cells"]]
    for ax, (name, unit, higher_better) in zip(axes, FIGURES):
        bars = ax.bar(range(len(labels)), [c["ratio"][name] for c in result["cells"]])
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylabel(f"minipd / peer ({'higher' if higher_better else 'lower'} is minipd better)")
        ax.set_title(f"{FIGURE_TITLES[name]} ({unit}): minipd / peer", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"minipd vs {peer_name(result)} ({result['model']}), the same workloads in one run", fontsize=9)
    save(fig, path)
