"""`python -m minipd.ops.planner day`: a shifting day on a large cluster, fixed ratio vs controller.

    python -m minipd.ops.planner day --builtin llama3-70b-h100-tp4 --num-instances 64 \\
        --seconds-per-hour 30 --plot day.png --json day.json
    python -m minipd.ops.planner day --modes fixed switch scale both --plot day.png

`--modes`: "fixed" (the ratio held), "switch" (the ratio controller moves instances between
roles; the default pair is fixed and switch), "scale" (it adds an instance of the role it
wants while fewer than `--num-instances` are held, serving `--startup-s` later, and drains
and removes one from a pool idle for `--idle-window-s`), "both" (adds when there is room,
switches when not). Each mode reports its attainment and the GPU-hours it held (day hours x
instances held, starting and draining ones included, x the profile's GPUs per instance).

Each hour's shape is planned alone on `--plan-instances` instances first (its best split
and goodput per instance); the hour's rate is its load times that goodput. The fixed ratio
is the request-weighted mean of the hours' best prefill fractions (override with
`--fixed-prefill`); the controller starts from it. See `minipd.ops.planner.experiments.day_experiment`.
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from minipd.ops.planner.experiments.day_experiment import DAY_MODES, DEFAULT_MODES, SCALING_MODES, DayResult, run_day
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.profiles import BUILTIN, builtin_profile
from minipd.policy.pool_scaling import PoolBounds, ScalingConfig
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
    parser.add_argument(
        "--modes", nargs="+", choices=DAY_MODES, default=list(DEFAULT_MODES), help="(default: fixed switch)"
    )
    scale = parser.add_argument_group("scaling (modes scale and both)")
    scale.add_argument("--min-prefill", type=int, default=1, help="(default: 1)")
    scale.add_argument("--max-prefill", type=int, help="(default: no bound but --num-instances)")
    scale.add_argument("--min-decode", type=int, default=1, help="(default: 1)")
    scale.add_argument("--max-decode", type=int, help="(default: no bound but --num-instances)")
    scale.add_argument("--scale-cooldown-s", type=float, default=1.0, help="between two scale actions (default: 1.0)")
    scale.add_argument(
        "--idle-window-s",
        type=float,
        default=5.0,
        help="a pool idle this long loses an instance (compressed time; default: 5.0)",
    )
    scale.add_argument(
        "--idle-threshold",
        type=float,
        default=0.5,
        help="a pool is idle while its load (prefill: time stepping; decode: KV reserved), "
        "spread over one instance fewer, stays under this (default: 0.5)",
    )
    scale.add_argument(
        "--startup-s",
        type=float,
        default=1.0,
        help="an added instance serves this long after the decision (default: 1.0)",
    )
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--plot", metavar="FILE.png")


def print_day(result: DayResult) -> None:
    print(
        f"{result.profile} x{result.num_instances}, SLO {result.slo}, {result.num_requests} requests, "
        f"each hour simulated for {result.seconds_per_hour:g} s"
    )
    for s in result.shapes:
        print(f"  shape {s.shape:<10} alone: best {s.best_split}, {s.goodput_per_instance:.2f} rps per instance")
    names = [m.name for m in result.modes]
    scaled = [m.name for m in result.modes if m.name in SCALING_MODES]
    print(
        f"  {'hour':>4} {'shape':<10} {'rps':>7} "
        + " ".join(f"{n:>7}" for n in names)
        + "".join(f" {n + ' P':>8}" for n in names if n != "fixed")
        + "".join(f" {n + ' held':>10}" for n in scaled)
    )
    for h in result.hours:
        print(
            f"  {h.hour:>4} {h.shape:<10} {h.rate_rps:>7.1f} "
            + " ".join(f"{h.attainment[n]:>7.1%}" for n in names)
            + "".join(f" {h.prefill[n]:>8}" for n in names if n != "fixed")
            + "".join(f" {h.held[n]:>10.1f}" for n in scaled)
        )
    print(f"over the day (fixed ratio {result.fixed_prefill}P:{result.num_instances - result.fixed_prefill}D):")
    for m in result.modes:
        print(
            f"  {m.name:<7} attainment {m.attainment:6.1%}  GPU-hours {m.gpu_hours:7.1f} "
            f"({m.instance_hours:.1f} instance-hours)  {m.num_moves} moves, {m.num_added} added, "
            f"{m.num_removed} removed"
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
        n = args.num_instances
        bounds = PoolBounds(
            min_prefill=args.min_prefill,
            max_prefill=n if args.max_prefill is None else args.max_prefill,
            min_decode=args.min_decode,
            max_decode=n if args.max_decode is None else args.max_decode,
        )
        scale = ScalingConfig(bounds=bounds, cooldown_s=args.scale_cooldown_s, idle_window_s=args.idle_window_s)
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
            modes=tuple(args.modes),
            scale=scale,
            startup_delay_s=args.startup_s,
            idle_threshold=args.idle_threshold,
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
        from minipd.ops.planner.experiments.plots import day

        day(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
