"""serve: one workload at one rate against an OpenAI endpoint; prints vLLM's serving summary.

    python bench.py serve --url http://127.0.0.1:8000 --request-rate 1 --goodput ttft:2000 tpot:50
    python bench.py serve --mode disaggregated --model small --request-rate 0.8 --num-prompts 40
    python bench.py serve --mode colocated --num-instances 2 --dataset conversations.json --request-rate 1

Without `--url` the bench starts the deployment itself through the `minipd` command line and
stops every process afterwards. Metric names and definitions follow `vllm bench serve`
(TTFT, TPOT, ITL, E2EL, request goodput for the `--goodput` SLO), so the figures can be set
next to another server's; the SLO attainment counts failed requests as not good.
`--quick` runs a few requests on the tiny model (it overrides the workload and model flags).
"""

from __future__ import annotations

import argparse

import msgspec

from benchmarks.loadgen import options
from benchmarks.loadgen.deployments import external, start_colocated, start_disaggregated
from benchmarks.loadgen.measure import measure, record_rows
from benchmarks.loadgen.plotting import save, slo_line, subplots
from benchmarks.loadgen.processes import Processes
from benchmarks.loadgen.stats import RunSummary, format_summary
from minipd.ops.workload import LengthDist

DEFAULT_NUM_PROMPTS = 40
QUICK = {
    "model": "tiny",
    "num_prompts": 8,
    "prompt_len": LengthDist.uniform(48, 96),
    "output_len": LengthDist.fixed(8),
    "request_rate": 4.0,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_workload_arguments(parser)
    options.add_slo_arguments(parser)
    options.add_client_arguments(parser)
    options.add_server_arguments(parser)
    g = parser.add_argument_group("deployment")
    g.add_argument(
        "--url",
        action="append",
        default=[],
        help="an OpenAI-compatible server (repeat to take several in turn); without it the bench starts --mode itself",
    )
    g.add_argument(
        "--mode",
        choices=["colocated", "disaggregated"],
        default="disaggregated",
        help="what to start without --url (default: %(default)s)",
    )
    g.add_argument("--num-instances", type=int, default=1, help="colocated instances (default: 1)")
    g.add_argument("--num-prefill", type=int, default=1, help="prefill instances (default: 1)")
    g.add_argument("--num-decode", type=int, default=1, help="decode instances (default: 1)")
    g.add_argument("--link-gbps", type=float, default=None, help="cap the prefill instances' KV egress")
    g.add_argument(
        "--colocated-launch",
        choices=["auto", "router", "separate"],
        default="auto",
        help="colocated instances behind the router (needs --num-colocated in the launcher), as "
        "separate servers taken in turn, or whichever the launcher allows (default: auto)",
    )


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    if args.request_rate is None and not args.concurrency:
        args.request_rate = 1.0
    slo = options.slo_from(args.goodput)
    builder = options.prompt_builder(args)
    process = options.arrivals(args)
    specs = options.workload(args, process, args.num_prompts or DEFAULT_NUM_PROMPTS, builder)
    with Processes() as processes:
        if args.url:
            deployment = external(args.url)
        elif args.mode == "colocated":
            deployment = start_colocated(
                processes, options.server_options(args, specs), args.num_instances, args.colocated_launch
            )
        else:
            deployment = start_disaggregated(
                processes, options.server_options(args, specs), args.num_prefill, args.num_decode, args.link_gbps
            )
        measured = measure(deployment.urls, specs, builder, "serve", options.runner_config(args, args.concurrency), slo)
    return {
        "deployment": deployment._asdict(),
        "model": measured.result.model,
        "workload": {
            "name": "dataset" if args.dataset else args.workload,
            "dataset": args.dataset,
            "num_prompts": len(specs),
            "arrivals": msgspec.to_builtins(process),
            "seed": args.seed,
        },
        "slo": slo.as_ms(),
        "special_tokens": measured.result.special_tokens,
        "prompt_len_mismatches": measured.result.num_prompt_len_mismatches,
        "summary": msgspec.to_builtins(measured.summary),
        "requests": record_rows(measured.records),
    }


def print_table(result: dict) -> None:
    print(
        f"deployment: {result['deployment']['launch']}; model {result['model']!r}; "
        f"arrivals {result['workload']['arrivals']}"
    )
    print(format_summary(msgspec.convert(result["summary"], RunSummary)))


def plot(result: dict, path: str) -> None:
    """Cumulative distributions of TTFT and of TPOT/ITL, with the SLO bounds."""
    rows = [r for r in result["requests"] if r["success"]]
    fig, (ttft_ax, token_ax) = subplots(ncols=2)
    for ax, series, label in (
        (ttft_ax, [r["ttft_ms"] for r in rows], "TTFT"),
        (token_ax, [r["tpot_ms"] for r in rows if r["output_tokens"] > 1], "TPOT"),
        (token_ax, [g for r in rows for g in r["itl_ms"]], "ITL"),
    ):
        ordered = sorted(series)
        ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)
    slo = result["slo"]
    slo_line(ttft_ax, slo.get("ttft_ms"), "TTFT SLO", horizontal=False)
    slo_line(token_ax, slo.get("tpot_ms"), "TPOT SLO", horizontal=False)
    for ax, what in ((ttft_ax, "TTFT (ms)"), (token_ax, "per-token latency (ms)")):
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of requests / gaps")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"serve: {result['deployment']['launch']}, {result['workload']['arrivals']}", fontsize=9)
    save(fig, path)
