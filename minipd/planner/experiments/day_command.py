"""`python -m minipd.planner day`: a shifting day on a large cluster, fixed ratio vs controller.

    python -m minipd.planner day --builtin llama3-70b-h100-tp4 --num-instances 64 \\
        --seconds-per-hour 30 --plot day.png --json day.json

Each hour's shape is planned alone on `--plan-instances` instances first (its best split
and goodput per instance); the hour's rate is its load times that goodput. The fixed ratio
is the request-weighted mean of the hours' best prefill fractions (override with
`--fixed-prefill`); the controller starts from it. See `minipd.planner.experiments.day_experiment`.
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from minipd.planner.experiments.day_experiment import DayResult, run_day
from minipd.planner.kv_link import KVLink
from minipd.planner.latency_profile import LatencyProfile
from minipd.planner.profiles import BUILTIN, builtin_profile
from minipd.policy.ratio_controller import ControllerConfig
from minipd.slo.targets import SLO

DEFAULT_BUILTIN = "llama3-70b-h100-tp4"
DEFAULT_SLO = ("ttft:1500", "itl:40")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--profile", metavar="FILE")
    src.add_argument("--builtin", choices=sorted(BUILTIN), help=f"(default: {DEFAULT_BUILTIN})")
    parser.add_argument("--num-instances", type=int, default=64)
    parser.add_argument("--seconds-per-hour", type=float, default=30.0, help="simulated seconds per hour of the day")
    parser.add_argument("--plan-instances", type=int, default=8, help="cluster size each hour's shape is planned on")
    parser.add_argument("--fixed-prefill", type=int, help="prefill instances of the fixed ratio (and the start)")
    parser.add_argument("--slo", nargs="+", metavar="KEY:MS", help=f"(default: {' '.join(DEFAULT_SLO)})")
    parser.add_argument("--link-gbps", type=float, help="(default: the profile's)")
    parser.add_argument("--window-s", type=float, default=10.0, help="controller window (compressed time)")
    parser.add_argument("--cooldown-s", type=float, default=2.0, help="controller cool-down between moves")
    parser.add_argument("--hysteresis", type=float, default=0.05)
    parser.add_argument("--max-in-flight", type=int, default=4, help="moves still draining at once, at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--plot", metavar="FILE.png")


def print_day(result: DayResult) -> None:
    print(
        f"{result.profile} x{result.num_instances}, SLO {result.slo}, {result.num_requests} requests, "
        f"each hour simulated for {result.seconds_per_hour:g} s"
    )
    for s in result.shapes:
        print(f"  shape {s.shape:<10} alone: best {s.best_split}, {s.goodput_per_instance:.2f} rps per instance")
    print(f"  {'hour':>4} {'shape':<10} {'rps':>7} {'fixed':>7} {'controller':>10} {'ctl prefill':>11}")
    for h in result.hours:
        print(
            f"  {h.hour:>4} {h.shape:<10} {h.rate_rps:>7.1f} {h.fixed_attainment:>7.1%} "
            f"{h.controller_attainment:>10.1%} {h.controller_prefill:>11}"
        )
    print(
        f"attainment over the day: fixed {result.fixed_prefill}P:{result.num_instances - result.fixed_prefill}D "
        f"{result.fixed_attainment:.1%}, controller {result.controller_attainment:.1%} ({len(result.moves)} moves)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        profile = (
            LatencyProfile.load(args.profile) if args.profile else builtin_profile(args.builtin or DEFAULT_BUILTIN)
        )
        slo = SLO.parse(args.slo or list(DEFAULT_SLO))
        link = KVLink(args.link_gbps or profile.link_gbps, profile.link_setup_s, True, profile.num_layers)
        controller = ControllerConfig(
            slo=slo,
            window_s=args.window_s,
            cooldown_s=args.cooldown_s,
            hysteresis=args.hysteresis,
            max_in_flight=args.max_in_flight,
        )
        result = run_day(
            profile,
            num_instances=args.num_instances,
            seconds_per_hour=args.seconds_per_hour,
            slo=slo,
            link=link,
            controller=controller,
            plan_instances=args.plan_instances,
            fixed_prefill=args.fixed_prefill,
            seed=args.seed,
        )
    except ValueError as exc:
        print(f"minipd plan day: {exc}", file=sys.stderr)
        return 2
    print_day(result)
    if args.json:
        with open(args.json, "wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode(result), indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        from minipd.planner.experiments.plots import day

        day(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
