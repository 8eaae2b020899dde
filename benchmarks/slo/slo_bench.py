"""slo: SLO attainment and goodput against request rate, colocated vs disaggregated.

The prompt-heavy workload at several Poisson rates on equal resources: `--num-colocated`
instances doing both phases with chunked prefill, against `--num-prefill` prefill +
`--num-decode` decode instances, every instance on `--torch-threads` compute threads. Two
SLOs are judged on the same requests:

- itl_tight: a tight TPOT (the per-request mean ITL) with a loose TTFT: the SLO that
  prefill interference breaks on colocated instances, where every prompt's chunks sit in
  the same steps as the running decodes;
- ttft_tight: a tight TTFT with a loose TPOT: the SLO that favours colocated instances
  here, since all of them prefill while the disaggregated pair has one prefill instance.

Both deployments stay up for the whole sweep and take turns at each rate (alternating which
goes first), so the drift of a shared machine hits both alike. Goodput (DistServe): the
highest rate at which at least 90% of requests meet the SLO, interpolated between the rates
measured around the crossing (or bisected with `--bisect-steps`). Failed requests are never
good. The winner depends on the SLO: both sides are reported.

    python bench.py slo --model small --json slo.json --plot slo.png
"""

from __future__ import annotations

import argparse
from typing import Callable, NamedTuple

from benchmarks.loadgen import options
from benchmarks.loadgen.deployments import Deployment, ServerOptions, start_colocated, start_disaggregated
from benchmarks.loadgen.measure import Measured, measure
from benchmarks.loadgen.plotting import save, slo_line, subplots
from benchmarks.loadgen.processes import Processes
from benchmarks.loadgen.rate_sweep import DEFAULT_STOP_BELOW, ratio, sweep_rates
from minipd.ops.workload import LengthDist

MODES = ("colocated", "disaggregated")
DEFAULT_RATES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2, 1.5)
DEFAULT_ITL_TIGHT = ["ttft:5000", "tpot:50"]
DEFAULT_TTFT_TIGHT = ["ttft:1500", "tpot:250"]
DEFAULT_DURATION_S = 40.0
MODE_COLORS = {"colocated": "tab:blue", "disaggregated": "tab:orange"}
SLO_STYLES = {"itl_tight": "-", "ttft_tight": ":"}
DEFAULT_MIN_PROMPTS = 20
QUICK = {
    "model": "tiny",
    "rates": [2.0, 4.0],
    "prompt_len": LengthDist.uniform(64, 128),
    "output_len": LengthDist.fixed(8),
    "duration_s": 2.0,
    "min_prompts": 6,
    "bisect_steps": 0,
    "itl_slo": ["ttft:2000", "tpot:100"],
    "ttft_slo": ["ttft:1000", "tpot:400"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_workload_arguments(parser, with_rate=False)
    options.add_client_arguments(parser)
    options.add_server_arguments(parser)
    g = parser.add_argument_group("sweep")
    g.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES), help="requests per second")
    g.add_argument(
        "--duration-s",
        type=float,
        default=DEFAULT_DURATION_S,
        help="arrivals per run span about this long: rate x duration requests (default: %(default)s)",
    )
    g.add_argument("--min-prompts", type=int, default=DEFAULT_MIN_PROMPTS, help="at least this many per run")
    g.add_argument(
        "--stop-below",
        type=float,
        default=DEFAULT_STOP_BELOW,
        help="skip higher rates once every SLO's attainment is below this (default: %(default)s)",
    )
    g.add_argument("--bisect-steps", type=int, default=0, help="refine each goodput by bisection (extra runs)")
    g.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    g.add_argument("--num-colocated", type=int, default=2, help="colocated instances (default: %(default)s)")
    g.add_argument("--num-prefill", type=int, default=1, help="prefill instances (default: %(default)s)")
    g.add_argument("--num-decode", type=int, default=1, help="decode instances (default: %(default)s)")
    g.add_argument(
        "--colocated-launch",
        choices=["auto", "router", "separate"],
        default="auto",
        help="colocated instances behind the router (needs the launcher's --num-colocated), separate "
        "servers taken in turn, or whichever the launcher allows (default: auto)",
    )
    options.add_slo_arguments(parser, "--itl-slo", DEFAULT_ITL_TIGHT, "the ITL-tight SLO (default: %(default)s)")
    options.add_slo_arguments(parser, "--ttft-slo", DEFAULT_TTFT_TIGHT, "the TTFT-tight SLO (default: %(default)s)")


class SweepSetup(NamedTuple):
    """What every sweep over `--rates` at this bench's load needs (the tracing and viewers
    benches run the same load): its SLOs, prompts, client settings, the requests of run
    `run_number` at a rate, and one server configuration that fits the longest of them."""

    slos: dict
    builder: object
    config: object
    specs_at: Callable[[float, int], list]
    server: ServerOptions


def sweep_setup(args: argparse.Namespace) -> SweepSetup:
    slos = {"itl_tight": options.slo_from(args.itl_slo), "ttft_tight": options.slo_from(args.ttft_slo)}
    builder = options.prompt_builder(args)

    def specs_at(rate: float, run_number: int):
        num = max(args.min_prompts, round(rate * args.duration_s))
        return options.workload(args, options.arrivals(args, rate), num, builder, seed_offset=run_number)

    # one server configuration for every run: the context fits the longest request of any rate
    server = options.server_options(args, [s for i, r in enumerate(args.rates) for s in specs_at(r, i)])
    return SweepSetup(slos, builder, options.runner_config(args), specs_at, server)


def _start(mode: str, processes: Processes, server: ServerOptions, args: argparse.Namespace) -> Deployment:
    if mode == "colocated":
        return start_colocated(processes, server, args.num_colocated, args.colocated_launch)
    return start_disaggregated(processes, server, args.num_prefill, args.num_decode)


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    slos, builder, config, specs_at, server = sweep_setup(args)
    result = {
        "model": args.model,
        "workload": args.dataset or args.workload,
        "torch_threads": args.torch_threads,
        "slo": {name: slo.as_ms() for name, slo in slos.items()},
        "modes": {},
        "max_model_len": server.max_model_len,
        "duration_s": args.duration_s,
    }
    with Processes() as processes:
        # every deployment is up for the whole sweep (idle ones cost no CPU), and the modes take
        # turns at each rate
        deployments = {mode: _start(mode, processes, server, args) for mode in args.modes}

        def runner(mode: str, deployment: Deployment):
            def run_at(rate: float, run_number: int) -> Measured:
                return measure(deployment.urls, specs_at(rate, run_number), builder, f"{mode}-{run_number}", config)

            return run_at

        sweeps = sweep_rates(
            args.rates,
            {mode: runner(mode, d) for mode, d in deployments.items()},
            slos,
            args.stop_below,
            args.bisect_steps,
        )
    for mode, sweep in sweeps.items():
        result["modes"][mode] = {**sweep.as_json(slos), "launch": deployments[mode].launch}
    if set(MODES) <= set(result["modes"]):
        coloc, disagg = result["modes"]["colocated"], result["modes"]["disaggregated"]
        result["goodput_ratio_disagg_over_coloc"] = {
            name: ratio(disagg["goodput_rps"][name], coloc["goodput_rps"][name]) for name in slos
        }
    return result


def print_table(result: dict) -> None:
    slo_text = {
        name: " ".join(f"{k.removesuffix('_ms')}:{v:g}" for k, v in slo.items()) for name, slo in result["slo"].items()
    }
    print(
        f"slo: model {result['model']}, workload {result['workload']}, {result['torch_threads']} compute "
        f"thread(s) per instance; SLOs: " + "; ".join(f"{n} = {t}" for n, t in slo_text.items())
    )
    names = list(result["slo"])
    header = f"{'mode':>13} {'rate':>5} {'reqs':>4} {'fail':>4} " + " ".join(f"{n:>11}" for n in names)
    print(header + f" {'P90 TTFT':>9} {'P90 ITL':>8} {'P99 ITL':>8} {'other jobs':>10}")
    for mode, m in result["modes"].items():
        for i, rate in enumerate(m["rates"]):
            att = " ".join(f"{m['attainment'][n][i]:>11.0%}" for n in names)
            print(
                f"{mode:>13} {rate:>5.2f} {m['num_requests'][i]:>4} {m['num_failed'][i]:>4} {att} "
                f"{m['p90_ttft_ms'][i]:>7.0f}ms {m['p90_itl_ms'][i]:>6.1f}ms {m['p99_itl_ms'][i]:>6.0f}ms "
                f"{m['foreign_cpu'][i]:>10.0%}"
            )
    for mode, m in result["modes"].items():
        goodputs = ", ".join(
            f"{n} {m['goodput_rps'][n]:.2f} req/s" + (f" ({m['goodput_flags'][n]})" if n in m["goodput_flags"] else "")
            for n in names
        )
        print(f"goodput {mode} ({m['launch']}): {goodputs}")
    for name, r in result.get("goodput_ratio_disagg_over_coloc", {}).items():
        winner = "disaggregated" if r > 1 else "colocated" if r < 1 else "neither"
        print(f"{name}: disaggregated / colocated goodput = {r:.2f} -> {winner} wins")


def plot(result: dict, path: str) -> None:
    fig, (att_ax, ttft_ax, itl_ax) = subplots(ncols=3, width=5.0)
    for mode, m in result["modes"].items():
        color = MODE_COLORS.get(mode)
        for name, values in m["attainment"].items():
            att_ax.plot(m["rates"], values, SLO_STYLES.get(name, "-"), color=color, marker="o", label=f"{mode}, {name}")
        ttft_ax.plot(m["rates"], m["p90_ttft_ms"], color=color, marker="o", label=mode)
        itl_ax.plot(m["rates"], m["p90_itl_ms"], color=color, marker="o", label=mode)
    att_ax.axhline(0.9, color="grey", linestyle="--", linewidth=1, label="90% target")
    att_ax.set_ylabel("SLO attainment")
    att_ax.set_ylim(-0.03, 1.03)
    for name, slo in result["slo"].items():
        slo_line(ttft_ax, slo.get("ttft_ms"), f"{name} TTFT SLO", style=SLO_STYLES.get(name, "--"))
        slo_line(itl_ax, slo.get("tpot_ms"), f"{name} TPOT SLO", style=SLO_STYLES.get(name, "--"))
    ttft_ax.set_ylabel("P90 TTFT (ms)")
    ttft_ax.set_yscale("log")
    itl_ax.set_ylabel("P90 ITL (ms)")
    itl_ax.set_yscale("log")
    for ax in (att_ax, ttft_ax, itl_ax):
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"slo: {result['workload']} on {result['model']}, colocated vs disaggregated", fontsize=10)
    save(fig, path)
