"""controller: the live P:D ratio controller against a fixed ratio, on a shifting workload.

The shift workload (minipd.ops.workload's `shift`: prefill-heavy, then decode-heavy) with lengths
and rates sized for this small machine, on two local clusters of three instances that start
alike (`--num-prefill 2 --num-decode 1`): one keeps that ratio, the other's router runs the
ratio controller (`--ratio-controller`). Each run sends the same requests through the OpenAI
load client (benchmarks/loadgen), one cluster after the other.

Both phases are bounded by something other than this machine's two cores, so that moving an
instance can help (two instances on two shared cores are not twice one):
- prefill by its KV link: every instance's egress is capped (`--link-gbps`), so a prefill
  instance sends at most that many prompts' KV per second;
- decode by its KV pool (`--num-blocks`): a decode instance holds only so many long answers;
  past that its sequences are preempted and recomputed, which stalls them (both clusters run
  with `--kv-admission-ratio 0`, so that a full pool queues its requests, as this experiment
  needs, instead of refusing them with 503 at the door): the controller,
  given a `tpot` objective, judges every token by its request's time per output token so
  far, so a stall counts against every later token of that request.
The fixed 2P:1D suits the first phase and chokes on the second; the controller should move a
prefill instance to decode once the decode waits show, and not flap.

Reported: each run's SLO attainment in the first half (prefill-heavy) and the second half
(decode-heavy), every role change with its time from the run's start, and lost requests
(failed in the controller's run, the one with role switches: a switch must lose none).

    python bench.py controller --json controller.json --plot controller.png
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request

import msgspec

from benchmarks.loadgen import options
from benchmarks.loadgen.deployments import Deployment, start_disaggregated
from benchmarks.loadgen.measure import MS_PER_S, Measured, measure
from benchmarks.loadgen.plotting import save, slo_line, subplots
from benchmarks.loadgen.processes import Processes
from minipd.ops.loadgen.records import attainment
from minipd.ops.workload import ArrivalProcess, LengthDist, RequestSpec, make_workload
from minipd.slo.targets import SLO

DEFAULTS = {
    # `small` rather than `tiny`: its decode steps are slow enough that a full KV pool, not
    # the token streams through the router and the client, bounds decode on two cores
    "model": "small",
    "first_prompt_len": LengthDist.uniform(128, 256),
    "first_output_len": LengthDist.uniform(8, 16),
    "second_prompt_len": LengthDist.uniform(24, 48),
    "second_output_len": LengthDist.uniform(384, 512),
    "first_rate": 2.0,
    # one decode instance holds ~3 of these answers at a time and serves ~0.5 req/s, two
    # serve ~1 req/s: the second phase needs the second decode instance, and fits with it
    "second_rate": 0.9,
    "first_duration_s": 40.0,
    "second_duration_s": 90.0,
}
DEFAULT_LINK_GBPS = 0.015  # 15 Mbit/s: a 192-token prompt of `small` (bf16, 8 KiB/token) takes ~0.8 s to send
DEFAULT_NUM_BLOCKS = 96  # 1536 tokens of KV per instance: ~3 whole answers of the second phase
DEFAULT_SLO = ["ttft:2000", "tpot:50"]
DEFAULT_CONTROLLER_SLO = ["ttft:2000", "tpot:50"]  # the SLO attainment is judged against
# a wide hysteresis band: on a shared 2-core machine a burst of other jobs stalls a few
# sequences now and then, which must not move an instance; a phase that is wrong for the ratio
# takes an attainment far lower
CONTROLLER_FLAGS = {"window_s": 15.0, "cooldown_s": 15.0, "min_samples": 15, "interval_s": 1.0, "hysteresis": 0.2}
QUICK = {
    "model": "tiny",
    "link_gbps": 0.002,  # the same ~0.8 s per prompt at tiny's 1 KiB/token
    "num_blocks": 128,
    "first_rate": 3.0,
    "second_rate": 3.0,
    "first_duration_s": 4.0,
    "second_duration_s": 4.0,
    "second_output_len": LengthDist.uniform(32, 64),
    "first_prompt_len": LengthDist.uniform(64, 128),
    "window_s": 3.0,
    "cooldown_s": 2.0,
    "min_samples": 3,
    "hysteresis": 0.05,
}
ADMIN_TIMEOUT_S = 30.0


def _length(text: str) -> LengthDist:
    try:
        return LengthDist.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_client_arguments(parser)
    options.add_server_arguments(parser, default_model=DEFAULTS["model"])
    g = parser.add_argument_group("the shift workload: a prefill-heavy phase, then a decode-heavy one")
    for phase in ("first", "second"):
        g.add_argument(f"--{phase}-prompt-len", type=_length, default=DEFAULTS[f"{phase}_prompt_len"], metavar="DIST")
        g.add_argument(f"--{phase}-output-len", type=_length, default=DEFAULTS[f"{phase}_output_len"], metavar="DIST")
        g.add_argument(f"--{phase}-rate", type=float, default=DEFAULTS[f"{phase}_rate"], help="requests/s (Poisson)")
        g.add_argument(f"--{phase}-duration-s", type=float, default=DEFAULTS[f"{phase}_duration_s"])
    g.add_argument("--seed", type=int, default=0)
    c = parser.add_argument_group("clusters and controller")
    c.add_argument("--num-prefill", type=int, default=2, help="prefill instances at the start (default: 2)")
    c.add_argument("--num-decode", type=int, default=1, help="decode instances at the start (default: 1)")
    c.add_argument("--link-gbps", type=float, default=DEFAULT_LINK_GBPS, help="every instance's KV egress cap")
    parser.set_defaults(num_blocks=DEFAULT_NUM_BLOCKS)
    add_controller_arguments(parser, c)


def add_controller_arguments(parser: argparse.ArgumentParser, group, flags: dict | None = None) -> None:
    """`--goodput` (what attainment is judged against), `--controller-slo`, and one flag per
    entry of `flags` (default CONTROLLER_FLAGS: the ratio controller's --controller-* settings;
    other entries name the cluster flag of the same name) with its default."""
    options.add_slo_arguments(
        parser, "--goodput", DEFAULT_SLO, "the SLO attainment is judged against (default: %(default)s)"
    )
    group.add_argument(
        "--controller-slo",
        nargs="+",
        default=DEFAULT_CONTROLLER_SLO,
        metavar="KEY:MS",
        help="the controller's objectives: ttft and itl or tpot (default: %(default)s)",
    )
    for field, value in (flags or CONTROLLER_FLAGS).items():
        flag = field.replace("_", "-")
        group.add_argument(
            f"--{flag}",
            type=type(value),
            default=value,
            dest=field,
            help=f"the cluster's --{'controller-' + flag if field in CONTROLLER_FLAGS else flag} "
            "(default: %(default)s)",
        )


def shift_workload(args: argparse.Namespace) -> tuple[list[RequestSpec], int]:
    """The requests of both phases (the second arriving after the first's span) and how many
    are in the first."""
    specs = []
    for i, phase in enumerate(("first", "second")):
        rate, duration = getattr(args, f"{phase}_rate"), getattr(args, f"{phase}_duration_s")
        name = "prefill-heavy" if phase == "first" else "decode-heavy"
        part = make_workload(
            name,
            max(1, round(rate * duration)),
            ArrivalProcess.poisson(rate),
            seed=args.seed + i,
            prompt_len=getattr(args, f"{phase}_prompt_len"),
            output_len=getattr(args, f"{phase}_output_len"),
        )
        offset = args.first_duration_s if phase == "second" else 0.0
        specs += [s._replace(arrival_s=s.arrival_s + offset) for s in part]
        if phase == "first":
            num_first = len(part)
    return specs, num_first


# Overcommit the decode pools (no KV admission limit): the decode-heavy phase must queue and
# preempt on a full pool, which the controller can fix by adding a decode instance, rather
# than be refused, which would hide the shortage from both clusters' latencies.
QUEUE_ON_A_FULL_POOL = ("--kv-admission-ratio", "0")


def controller_flags(args: argparse.Namespace) -> tuple[str, ...]:
    return (
        *QUEUE_ON_A_FULL_POOL,
        "--ratio-controller",
        "--controller-slo",
        *args.controller_slo,
        *(
            item
            for field in CONTROLLER_FLAGS
            for item in (f"--controller-{field.replace('_', '-')}", str(getattr(args, field)))
        ),
    )


def admin_instances(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/admin/instances", timeout=ADMIN_TIMEOUT_S) as response:
        return json.loads(response.read())


def _run_summary(measured: Measured, num_first: int, slo: SLO, start_wall: float) -> dict:
    records = sorted(measured.records, key=lambda r: r.index)
    first, second = records[:num_first], records[num_first:]
    return {
        "attainment_first_half": attainment(first, slo),
        "attainment_second_half": attainment(second, slo),
        "attainment": attainment(records, slo),
        "failed": sum(not r.success for r in records),
        "errors": sorted({r.error or "unknown" for r in records if not r.success}),
        "p90_ttft_ms": measured.p90_ttft_ms(),
        "p90_itl_ms": measured.p90_itl_ms(),
        "foreign_cpu": measured.foreign_cpu,
        "start_wall": start_wall,
        "requests": {
            "sent_s": [r.sent_s for r in records],
            "ttft_ms": [r.ttft_s * MS_PER_S for r in records],
            "tpot_ms": [r.tpot_s * MS_PER_S for r in records],
            "success": [r.success for r in records],
        },
    }


def _measure(name: str, deployment: Deployment, specs, builder, config, slo, num_first: int) -> dict:
    measured = measure(deployment.urls, specs, builder, f"controller-bench-{name}", config, slo)
    start_wall = time.time() - measured.result.duration_s  # the run's clock started with its first request
    return {**_run_summary(measured, num_first, slo, start_wall), "launch": deployment.launch}


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    args.prompt_len = args.output_len = args.dataset = None
    args.workload, args.tokenizer = "shift", None
    slo = options.slo_from(args.goodput)
    specs, num_first = shift_workload(args)
    builder = options.prompt_builder(args)
    config = options.runner_config(args)
    server = options.server_options(args, specs)
    result = {
        "model": args.model,
        "workload": "shift",
        "num_requests": len(specs),
        "num_first_half": num_first,
        "phases": {
            phase: {
                "prompt_len": msgspec.to_builtins(getattr(args, f"{phase}_prompt_len")),
                "output_len": msgspec.to_builtins(getattr(args, f"{phase}_output_len")),
                "rate": getattr(args, f"{phase}_rate"),
                "duration_s": getattr(args, f"{phase}_duration_s"),
            }
            for phase in ("first", "second")
        },
        "start_ratio": f"{args.num_prefill}P:{args.num_decode}D",
        "link_gbps": args.link_gbps,
        "num_blocks": server.num_blocks,
        "torch_threads": args.torch_threads,
        "slo": slo.as_ms(),
        "controller": {"slo": args.controller_slo, **{f: getattr(args, f) for f in CONTROLLER_FLAGS}},
    }
    with Processes() as processes:
        fixed = start_disaggregated(
            processes, server, args.num_prefill, args.num_decode, args.link_gbps, router_flags=QUEUE_ON_A_FULL_POOL
        )
        controlled = start_disaggregated(
            processes, server, args.num_prefill, args.num_decode, args.link_gbps, router_flags=controller_flags(args)
        )
        result["fixed"] = _measure("fixed", fixed, specs, builder, config, slo, num_first)
        result["controller"] = {
            **result["controller"],
            **_measure("controlled", controlled, specs, builder, config, slo, num_first),
        }
        listed = admin_instances(controlled.urls[0])
    start = result["controller"]["start_wall"]
    result["role_changes"] = [
        {
            "t": c["decided_at"] - start,
            "instance": c["instance_id"],
            "from": c["from_role"],
            "to": c["to_role"],
            "switch_s": c["total_s"],
            "drain_s": c["drain_s"],
        }
        for c in listed["role_changes"]
    ]
    result["final_roles"] = {i["instance"]: i["role"] for i in listed["instances"]}
    result["lost_requests"] = result["controller"]["failed"]  # the run with the role switches
    result["controller_beats_fixed_second_half"] = (
        result["controller"]["attainment_second_half"] > result["fixed"]["attainment_second_half"]
    )
    return result


def print_table(result: dict) -> None:
    first, second = result["phases"]["first"], result["phases"]["second"]
    slo_text = " ".join(f"{key.removesuffix('_ms')}:{value:g}" for key, value in result["slo"].items())
    print(
        f"controller: shift workload on {result['model']}, {result['num_requests']} requests "
        f"({result['num_first_half']} prefill-heavy at {first['rate']:g}/s, then decode-heavy at "
        f"{second['rate']:g}/s); 3 instances starting {result['start_ratio']}, KV egress "
        f"{result['link_gbps'] * 1e3:g} Mbit/s, {result['num_blocks']} KV blocks each; SLO {slo_text}"
    )
    print(
        f"{'run':>10} {'1st half':>9} {'2nd half':>9} {'all':>6} {'failed':>6} {'P90 TTFT':>9} {'P90 ITL':>8} "
        f"{'other jobs':>10}"
    )
    for name in ("fixed", "controller"):
        r = result[name]
        print(
            f"{name:>10} {r['attainment_first_half']:>9.0%} {r['attainment_second_half']:>9.0%} "
            f"{r['attainment']:>6.0%} {r['failed']:>6} {r['p90_ttft_ms']:>7.0f}ms {r['p90_itl_ms']:>6.1f}ms "
            f"{r['foreign_cpu']:>10.0%}"
        )
    for c in result["role_changes"]:
        print(
            f"  t={c['t']:6.1f}s {c['instance']}: {c['from']} -> {c['to']} (switch {c['switch_s']:.2f} s, of it "
            f"draining {c['drain_s']:.2f} s)"
        )
    verdict = "beats" if result["controller_beats_fixed_second_half"] else "does NOT beat"
    print(f"second half: the controller {verdict} the fixed ratio; lost requests: {result['lost_requests']}")


def _roles_over_time(result: dict) -> tuple[list[float], list[int]]:
    """(times, prefill instances) of the controlled cluster, as a step function."""
    prefill = int(result["start_ratio"].split("P")[0])
    times, counts = [0.0], [prefill]
    for c in result["role_changes"]:
        times.append(c["t"] + c["switch_s"])
        prefill += (c["to"] == "prefill") - (c["from"] == "prefill")
        counts.append(prefill)
    times.append(max(result["controller"]["requests"]["sent_s"] or [0.0]) + 1.0)
    counts.append(prefill)
    return times, counts


def plot(result: dict, path: str) -> None:
    fig, (roles_ax, ttft_ax, tpot_ax) = subplots(nrows=3, width=8.0, height=2.6)
    times, prefill = _roles_over_time(result)
    total = sum(int(x) for x in result["start_ratio"].replace("P", " ").replace("D", " ").split(":") if x.strip())
    roles_ax.step(times, prefill, where="post", label="controller: prefill instances")
    roles_ax.step(times, [total - p for p in prefill], where="post", label="controller: decode instances")
    fixed_p = int(result["start_ratio"].split("P")[0])
    roles_ax.axhline(fixed_p, color="grey", linestyle=":", label=f"fixed {result['start_ratio']}")
    roles_ax.set_ylabel("instances")
    roles_ax.set_ylim(-0.2, total + 0.2)
    styles = {"fixed": ("tab:red", "x"), "controller": ("tab:blue", ".")}
    for name, (color, marker) in styles.items():
        r = result[name]["requests"]
        ok = [i for i, s in enumerate(r["success"]) if s]
        ttft_ax.scatter(
            [r["sent_s"][i] for i in ok], [r["ttft_ms"][i] for i in ok], s=8, c=color, marker=marker, label=name
        )
        tpot_ax.scatter(
            [r["sent_s"][i] for i in ok], [r["tpot_ms"][i] for i in ok], s=8, c=color, marker=marker, label=name
        )
    slo_line(ttft_ax, result["slo"].get("ttft_ms"), "TTFT SLO")
    slo_line(tpot_ax, result["slo"].get("tpot_ms"), "TPOT SLO")
    ttft_ax.set_yscale("log")
    ttft_ax.set_ylabel("TTFT (ms)")
    tpot_ax.set_ylabel("TPOT (ms)")
    tpot_ax.set_xlabel("request sent at (s from the start of the run)")
    boundary = result["phases"]["first"]["duration_s"]
    for ax in (roles_ax, ttft_ax, tpot_ax):
        ax.axvline(boundary, color="black", linewidth=0.8, linestyle="--")
        for c in result["role_changes"]:
            ax.axvline(c["t"], color="tab:green", linewidth=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    roles_ax.set_title(
        f"controller vs fixed ratio on the shift workload (dashed: prefill-heavy -> decode-heavy; "
        f"green: moves); 2nd-half attainment fixed {result['fixed']['attainment_second_half']:.0%}, "
        f"controller {result['controller']['attainment_second_half']:.0%}",
        fontsize=9,
    )
    save(fig, path)
