"""`minipd plan` (for now `python -m minipd.ops.planner plan`): the best P:D split for a workload.

    python -m minipd.ops.planner plan --builtin llama3-8b-h100 --num-instances 8 \\
        --workload prefill-heavy --prompt-len lognormal:1024:0.6:64:8192 \\
        --output-len lognormal:200:0.6:8:1024 --slo ttft:500 itl:40 --plot plan.png --json plan.json

Prints a table of every split (all-colocated and every P:D with P + D = N) at one evaluated
rate, the winner (highest goodput) marked; `--link-gbps` re-plans at another KV bandwidth;
`--sweep-sizes 1 2 4 8 16` adds the cluster size below which colocated wins.
"""

from __future__ import annotations

import argparse
import math
import sys

import msgspec

from minipd.ops.planner.cluster_spec import COLOCATED_SCHEDULING
from minipd.ops.planner.experiments.size_sweep import SizeSweep, link_label, sweep_sizes
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.planner import EVAL_FRACTION, Plan, PlanConfig, plan
from minipd.ops.planner.profiles import BUILTIN, builtin_profile
from minipd.ops.planner.workload_spec import WorkloadSpec
from minipd.ops.workload import WORKLOADS
from minipd.policy.local_prefill import LocalPrefillThresholds
from minipd.slo.targets import SLO

DEFAULT_BUILTIN = "llama3-8b-h100"
DEFAULT_SLO = ("ttft:500", "itl:50")  # an interactive chat service; say yours with --slo
DEFAULT_REQUESTS_PER_INSTANCE = 200  # long enough for queues to settle at 90% attainment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("profile")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--profile", metavar="FILE", help="a latency profile JSON (python bench.py profile --json FILE)")
    src.add_argument("--builtin", choices=sorted(BUILTIN), help=f"a built-in profile (default: {DEFAULT_BUILTIN})")
    g = parser.add_argument_group("cluster")
    g.add_argument("--num-instances", type=int, default=4, help="N: every split with P + D = N (default: %(default)s)")
    g.add_argument(
        "--link-gbps", type=float, help="KV link out of each prefill instance, Gbit/s (default: the profile's)"
    )
    g.add_argument("--link-setup-ms", type=float, help="fixed cost per KV transfer (default: the profile's)")
    g.add_argument("--no-layerwise", action="store_true", help="send the KV after prefill instead of layer by layer")
    g.add_argument(
        "--local-prefill-max-tokens",
        type=int,
        nargs="+",
        default=[16],
        metavar="T",
        help="prefill prompts of at most T uncached tokens on decode; several values: the planner picks",
    )
    g.add_argument("--prefill-busy-tokens", type=int, help="also prefill locally while the prefill queue holds more")
    g.add_argument(
        "--colocated-budgets",
        type=int,
        nargs="+",
        metavar="TOKENS",
        help="chunk budgets to try for colocated instances (default: 512, 2048 and the profile's)",
    )
    g.add_argument(
        "--colocated-scheduling",
        choices=COLOCATED_SCHEDULING,
        default="chunked",
        help="colocated steps: minipd's chunked prefill, or whole prompts first (vLLM's original)",
    )
    g = parser.add_argument_group("workload")
    g.add_argument("--workload", choices=WORKLOADS, default="mixed")
    g.add_argument("--prompt-len", help="LengthDist, e.g. fixed:512, uniform:32:512, lognormal:1024:0.6:64:8192")
    g.add_argument("--output-len", help="LengthDist for the output tokens")
    g.add_argument(
        "--rate",
        type=float,
        help=f"evaluate every split at this total rps (default: {EVAL_FRACTION} of the winner's goodput)",
    )
    g.add_argument(
        "--num-requests",
        type=int,
        help=f"requests per simulated run (default: {DEFAULT_REQUESTS_PER_INSTANCE} per instance)",
    )
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma arrivals (1: Poisson)")
    g.add_argument("--seed", type=int, default=0)
    g = parser.add_argument_group("objectives")
    g.add_argument(
        "--slo",
        nargs="+",
        metavar="KEY:MS",
        help=f"ttft, tpot, itl, e2el objectives in milliseconds (default: {' '.join(DEFAULT_SLO)})",
    )
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="the same, in vllm bench serve's spelling")
    g.add_argument("--target", type=float, default=0.9, help="SLO attainment that counts as good (default: 0.9)")
    g = parser.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the plan (and sweep) as JSON")
    g.add_argument("--plot", metavar="FILE.png", help="draw the green-zone chart")
    g.add_argument("--sweep-sizes", type=int, nargs="+", metavar="N", help="also find where splitting stops paying")
    g.add_argument("--sweep-link-gbps", type=float, nargs="+", metavar="G", help="link bandwidths for the sweep")
    g.add_argument("--sweep-plot", metavar="FILE.png", help="draw the size sweep")


def _config(args: argparse.Namespace) -> PlanConfig:
    profile = LatencyProfile.load(args.profile) if args.profile else builtin_profile(args.builtin or DEFAULT_BUILTIN)
    slo = SLO.parse((args.slo or []) + (args.goodput or []) or list(DEFAULT_SLO))
    link = KVLink(
        args.link_gbps if args.link_gbps is not None else profile.link_gbps,
        args.link_setup_ms / 1000 if args.link_setup_ms is not None else profile.link_setup_s,
        not args.no_layerwise,
        profile.num_layers,
    )
    workload = WorkloadSpec(
        name=args.workload,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        num_requests=args.num_requests or 1,
        seed=args.seed,
        burstiness=args.burstiness,
    )
    thresholds = tuple(
        LocalPrefillThresholds(max_local_tokens=t, prefill_busy_tokens=args.prefill_busy_tokens)
        for t in args.local_prefill_max_tokens
    )
    return PlanConfig(
        profile=profile,
        num_instances=args.num_instances,
        workload=workload,
        slo=slo,
        link=link,
        local_prefill=thresholds,
        colocated_budgets=tuple(args.colocated_budgets or ()),
        colocated_scheduling=args.colocated_scheduling,
        requests_per_instance=None if args.num_requests else DEFAULT_REQUESTS_PER_INSTANCE,
        eval_rate_rps=args.rate,
        target=args.target,
    )


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}" if seconds < 10 else f"{seconds:.0f}s"


def print_plan(result: Plan, config: PlanConfig) -> None:
    p = config.profile
    print(
        f"profile {p.name} ({p.source}: {p.model} on {p.device}), {result.num_instances} instances, "
        f"SLO {result.slo} at {result.target:.0%}, link {link_label(result.link_gbps)}"
        f"{'' if config.link.layerwise else ' (after prefill)'}"
    )
    print(
        f"workload {result.workload.name} prompt {result.workload.prompt_len or 'default'} "
        f"output {result.workload.output_len or 'default'}; every split evaluated at {result.eval_rate_rps:.2f} rps"
    )
    print(
        f"  {'split':<14} {'setting':<16} {'P90 TTFT ms':>11} {'P90 ITL ms':>10} {'P90 TPOT ms':>11} "
        f"{'attain':>7} {'SLO':>4} {'goodput rps':>11} {'per inst':>8}"
    )
    for s in result.splits:
        mark = "*" if s.label == result.best else " "
        zone = "ok" if s.meets_slo else "miss"
        print(
            f"{mark} {s.label:<14} {s.setting:<16} {_ms(s.eval.ttft_s.p90):>11} {_ms(s.eval.itl_s.p90):>10} "
            f"{_ms(s.eval.tpot_s.p90):>11} {s.eval.attainment:>7.1%} {zone:>4} "
            f"{s.goodput_rps:>11.2f} {s.goodput_per_instance:>8.2f}"
        )
    colocated = next((s for s in result.splits if s.num_colocated), None)
    best = next(s for s in result.splits if s.label == result.best)
    versus = (
        f" ({best.goodput_per_instance / colocated.goodput_per_instance:.2f}x colocated)"
        if colocated and colocated.goodput_per_instance > 0
        else ""
    )
    print(f"winner: {best.label} ({best.setting}), {best.goodput_per_instance:.2f} rps per instance{versus}")


def print_sweep(sweep: SizeSweep) -> None:
    print("where splitting stops paying (goodput per instance, rps):")
    print(f"  {'link':<16} {'N':>4} {'colocated':>10} {'best split':>12} {'split':>8}  winner")
    for p in sweep.points:
        print(
            f"  {link_label(p.link_gbps):<16} {p.num_instances:>4} {p.colocated_per_instance:>10.2f} "
            f"{p.best_split or '-':>12} {p.best_split_per_instance:>8.2f}  "
            f"{'split' if p.splitting_pays else 'colocated'}"
        )
    for label, size in sweep.colocated_wins_below.items():
        verdict = (
            f"colocated chunked prefill wins below {size} instances"
            if size is not None
            else "no split beats colocated at the largest size swept"
        )
        print(f"  link {label}: {verdict}")


def run(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
        result = plan(config)
        sweep = None
        if args.sweep_sizes:
            links = [msgspec.structs.replace(config.link, gbps=g) for g in (args.sweep_link_gbps or [config.link.gbps])]
            sweep = sweep_sizes(config, args.sweep_sizes, links)
    except ValueError as exc:
        print(f"minipd plan: {exc}", file=sys.stderr)
        return 2
    print_plan(result, config)
    if sweep is not None:
        print_sweep(sweep)
    if args.json:
        with open(args.json, "wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode({"plan": result, "size_sweep": sweep}), indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        from minipd.ops.planner.experiments.plots import green_zone

        green_zone(result, config.slo.ttft_s, config.slo.decode_bound, args.plot)
        print(f"wrote {args.plot}")
    if args.sweep_plot and sweep is not None:
        from minipd.ops.planner.experiments.plots import size_sweep

        size_sweep(sweep, args.sweep_plot)
        print(f"wrote {args.sweep_plot}")
    return 0
