"""linkbw: TTFT and SLO attainment of a disaggregated cluster as its KV link is starved.

The prompt-heavy workload at one Poisson rate through one prefill + one decode instance,
once per KV link bandwidth, from generous to starved, by two methods:

- bucket: the transports' token bucket (`minipd --role cluster --link-gbps G`, a fresh
  cluster per bandwidth; the KV crosses loopback TCP, paced by the sender);
- netns: a real kernel link: prefill and decode in network namespaces of their own, the KV
  over TCP across a veth pair shaped by `tc` (tbf rate, netem delay where the kernel has
  it); one cluster, reshaped between runs. Needs root; skipped (with the reason) without.

For each, the bandwidth below which the TTFT SLO fails: the first crossing of the 90%
attainment target, interpolated in transfer time (1/bandwidth) between the two bandwidths
around it. Runs stop once attainment has fallen below `--stop-below`.

    python bench.py linkbw --model small --json linkbw.json --plot linkbw.png
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.loadgen import options
from benchmarks.loadgen.deployments import start_disaggregated
from benchmarks.loadgen.measure import Measured, measure
from benchmarks.loadgen.netns import ShapedLink, unavailable_reason
from benchmarks.loadgen.netns_cluster import start_netns_cluster
from benchmarks.loadgen.plotting import save, slo_line, subplots
from benchmarks.loadgen.processes import Processes
from benchmarks.loadgen.rate_sweep import DEFAULT_STOP_BELOW
from benchmarks.loadgen.server_metrics import transfer_totals
from minipd.ops.workload import LengthDist
from minipd.slo.goodput import bandwidth_threshold

METHODS = ("bucket", "netns")
DEFAULT_GBPS = (10.0, 2.0, 1.0, 0.5, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05)
DEFAULT_RATE = 0.4
DEFAULT_NUM_PROMPTS = 24
DEFAULT_SLO = ["ttft:1500"]
QUICK = {
    "model": "tiny",
    "gbps": [1.0, 0.005],
    "prompt_len": LengthDist.uniform(1024, 1536),
    "output_len": LengthDist.fixed(4),
    "request_rate": 2.0,
    "num_prompts": 6,
    "goodput": ["ttft:500"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_workload_arguments(parser)
    options.add_client_arguments(parser)
    options.add_server_arguments(parser)
    options.add_slo_arguments(
        parser,
        "--goodput",
        DEFAULT_SLO,
        "the SLO judged at each bandwidth, vllm bench serve syntax (default: %(default)s)",
    )
    g = parser.add_argument_group("link")
    g.add_argument(
        "--gbps",
        type=float,
        nargs="+",
        default=list(DEFAULT_GBPS),
        help="KV link bandwidths to run, Gbit/s (default: %(default)s)",
    )
    g.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    g.add_argument(
        "--netns-delay-ms",
        type=float,
        default=0.0,
        help="one-way delay of the shaped veth (netem; refused where the kernel lacks it)",
    )
    g.add_argument(
        "--stop-below",
        type=float,
        default=DEFAULT_STOP_BELOW,
        help="stop starving once attainment is below this (default: %(default)s)",
    )


def _run_point(urls: list[str], specs, builder, tag: str, config) -> tuple[Measured, float | None]:
    """One run, and the mean KV bytes per transfer the router counted during it."""
    before = transfer_totals(urls[0])
    measured = measure(urls, specs, builder, tag, config)
    after = transfer_totals(urls[0])
    per_transfer = after.since(before).bytes_per_transfer if before and after else None
    return measured, per_transfer


def _sweep(method: str, args: argparse.Namespace, specs_at, builder, server, slo) -> dict:
    config = options.runner_config(args)
    rows: dict[str, list] = {
        "link_gbps": [],
        "p90_ttft_ms": [],
        "attainment": [],
        "kv_bytes_per_request": [],
        "num_failed": [],
        "foreign_cpu": [],
    }
    extra: dict = {}

    def record(gbps: float, measured: Measured, kv_bytes: float | None) -> bool:
        rows["link_gbps"].append(gbps)
        rows["p90_ttft_ms"].append(measured.p90_ttft_ms())
        rows["attainment"].append(measured.attainment(slo))
        rows["kv_bytes_per_request"].append(kv_bytes)
        rows["num_failed"].append(measured.summary.failed)
        rows["foreign_cpu"].append(measured.foreign_cpu)
        return measured.attainment(slo) >= args.stop_below

    bandwidths = sorted(args.gbps, reverse=True)
    if method == "bucket":
        for i, gbps in enumerate(bandwidths):
            with Processes() as processes:
                deployment = start_disaggregated(processes, server, link_gbps=gbps)
                point = _run_point(deployment.urls, specs_at(i), builder, f"bucket-{i}", config)
            if not record(gbps, *point):
                break
        extra["launch"] = "minipd --role cluster --num-prefill 1 --num-decode 1 --link-gbps G"
    else:
        with ShapedLink() as link:
            link.set_rate(bandwidths[0], args.netns_delay_ms)
            with Processes() as processes:
                deployment = start_netns_cluster(processes, link, server)
                for i, gbps in enumerate(bandwidths):
                    link.set_rate(gbps, args.netns_delay_ms)
                    if not record(gbps, *_run_point(deployment.urls, specs_at(i), builder, f"netns-{i}", config)):
                        break
                extra["qdisc"] = link.qdiscs()
        extra["launch"] = deployment.launch
        extra["delay_ms"] = args.netns_delay_ms
    threshold = bandwidth_threshold(rows["link_gbps"], rows["attainment"])
    return {
        "method": method,
        **rows,
        **extra,
        "threshold_gbps": threshold.gbps,
        "last_passing_gbps": threshold.last_passing_gbps,
        "first_failing_gbps": threshold.first_failing_gbps,
        "never_fails": threshold.never_fails,
        "always_fails": threshold.always_fails,
    }


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    args.request_rate = args.request_rate or DEFAULT_RATE
    slo = options.slo_from(args.goodput)
    builder = options.prompt_builder(args)
    process = options.arrivals(args)
    num = args.num_prompts or DEFAULT_NUM_PROMPTS

    def specs_at(run_number: int):
        return options.workload(args, process, num, builder, seed_offset=run_number)

    server = options.server_options(args, [s for i in range(len(args.gbps)) for s in specs_at(i)])
    result = {
        "model": args.model,
        "workload": args.dataset or args.workload,
        "request_rate": args.request_rate,
        "num_prompts": num,
        "slo": slo.as_ms(),
        "torch_threads": args.torch_threads,
        "methods": {},
        "skipped": {},
    }
    for method in args.methods:
        reason = unavailable_reason() if method == "netns" else None
        if reason is not None:
            print(f"linkbw: skipping the netns method: {reason}", file=sys.stderr)
            result["skipped"][method] = reason
            continue
        result["methods"][method] = _sweep(method, args, specs_at, builder, server, slo)
    return result


def print_table(result: dict) -> None:
    slo = " ".join(f"{k.removesuffix('_ms')}:{v:g}" for k, v in result["slo"].items())
    print(
        f"linkbw: model {result['model']}, {result['workload']} at {result['request_rate']:g} req/s, "
        f"{result['num_prompts']} requests per bandwidth, SLO {slo}"
    )
    print(
        f"{'method':>7} {'Gbit/s':>7} {'KV MiB/req':>10} {'P90 TTFT':>9} {'attainment':>10} {'failed':>6} "
        f"{'other jobs':>10}"
    )
    for method, m in result["methods"].items():
        for i, gbps in enumerate(m["link_gbps"]):
            kv = m["kv_bytes_per_request"][i]
            print(
                f"{method:>7} {gbps:>7.3g} {'-' if kv is None else f'{kv / 2**20:.1f}':>10} "
                f"{m['p90_ttft_ms'][i]:>7.0f}ms {m['attainment'][i]:>10.0%} {m['num_failed'][i]:>6} "
                f"{m['foreign_cpu'][i]:>10.0%}"
            )
    for method, m in result["methods"].items():
        if m["never_fails"]:
            verdict = f"the SLO holds down to {m['last_passing_gbps']:g} Gbit/s (starve further to see it fail)"
        elif m["always_fails"]:
            verdict = f"the SLO fails even at {m['first_failing_gbps']:g} Gbit/s"
        else:
            verdict = (
                f"the TTFT SLO fails below {m['threshold_gbps']:.3g} Gbit/s (holds at "
                f"{m['last_passing_gbps']:g}, fails at {m['first_failing_gbps']:g})"
            )
        print(f"{method}: {verdict}")
    for method, reason in result["skipped"].items():
        print(f"{method}: skipped ({reason})")


def plot(result: dict, path: str) -> None:
    fig, (ttft_ax, att_ax) = subplots(ncols=2)
    for method, m in result["methods"].items():
        ttft_ax.plot(m["link_gbps"], m["p90_ttft_ms"], marker="o", label=method)
        att_ax.plot(m["link_gbps"], m["attainment"], marker="o", label=method)
        if m["threshold_gbps"] is not None:
            att_ax.axvline(
                m["threshold_gbps"],
                linestyle=":",
                linewidth=1,
                color=att_ax.lines[-1].get_color(),
                label=f"{method}: fails below {m['threshold_gbps']:.2g}",
            )
    slo_line(ttft_ax, result["slo"].get("ttft_ms"), "TTFT SLO")
    att_ax.axhline(0.9, color="grey", linestyle="--", linewidth=1, label="90% target")
    ttft_ax.set_ylabel("P90 TTFT (ms)")
    att_ax.set_ylabel("SLO attainment")
    att_ax.set_ylim(-0.03, 1.03)
    for ax in (ttft_ax, att_ax):
        ax.set_xscale("log")
        ax.set_xlabel("KV link bandwidth (Gbit/s)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"linkbw: {result['workload']} on {result['model']} at {result['request_rate']:g} req/s", fontsize=10)
    save(fig, path)
