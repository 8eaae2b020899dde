"""validate: the planner's simulator against the real engine, on the same workload lists.

A 1 prefill + 1 decode cluster (`minipd --role cluster`, TCP KV, `--torch-threads` per
instance, the profile's dtype and token budget) serves each workload through the OpenAI load
client (benchmarks/loadgen); the simulator runs the very same `RequestSpec` lists on a
`ClusterSpec.split(1, 1)` with a latency profile fitted on this machine, in the serving path:
1. a profile measured in-process (`bench.py profile`; `--profile FILE`, or measured here first)
   gives what only it can (KV bytes and capacity, layers), and its own step models are
   simulated too, as `profile_only`, to show what the serving path changes;
2. one calibration run per workload (other requests, drawn with other seeds, at the same
   rate) makes the instances log their steps (`--step-log-dir`); the prefill and decode
   step models are fitted to those steps (minipd.planner.step_log_fit);
3. the probe (validate_probe.py) measures the fixed per-request latency outside the steps.
Then the compared runs, which neither fit saw. This machine's speed wanders (the same step
runs 10-30% slower or faster from one stretch of seconds to the next, whatever the cluster
does), so each compared run is simulated with the speed its instances ran at during it
(minipd.planner.step_log_speed.speed_trace: each instance's logged steps against the fitted
models, a running mean over 1 s and the spread of single steps around it): "simulated", the
figures the targets are judged on. Beside it, "predicted" knows nothing of the run: the fitted
models with the step-time jitter the calibration runs showed (StepJitter, median of
`JITTER_SEEDS` draws), and "profile only" the in-process profile. Compared per workload
(prefill-heavy and decode-heavy, lengths and rates sized for this machine): P50 and P90 of TTFT and of ITL (every
gap), and the SLO attainment. The SLO is derived from the simulation, never from the
measurement: by default TTFT and TPOT bounds at the simulated 75th percentiles, so that
attainment is neither trivially 0 nor 1 (`--goodput` sets one instead). The simulator does not
model prefix caching, so the cluster runs without it (`--no-prefix-caching`) and its router
sends every prompt to prefill (`--local-prefill-max-tokens -1`; the load client's prompts share
their first block, which the router would otherwise count as cached on decode). Targets: latencies
within 15%, attainment within 5 points. Each workload is measured `--repeats` times (fresh
prompts) and every run is reported, so a miss from the shared machine's noise shows as such
(each run's `foreign_cpu` says how much of the machine other jobs took).

    python bench.py validate --profile profile.json --json validate.json --plot validate.png
    python bench.py validate --model small --torch-threads 1    # profiles first
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np

from benchmarks.loadgen import options
from benchmarks.loadgen.deployments import ServerOptions, start_disaggregated
from benchmarks.loadgen.measure import MS_PER_S, measure
from benchmarks.loadgen.plotting import save, subplots
from benchmarks.loadgen.processes import Processes
from benchmarks.loadgen.records import RequestRecord
from benchmarks.loadgen.runner import RunResult
from benchmarks.loadgen.slo import SLO as ClientSLO
from benchmarks.loadgen.slo import attainment
from benchmarks.loadgen.stats import percentile
from benchmarks.profile import profile_bench
from benchmarks.validate import validate_probe
from minipd.planner import step_log_fit, step_log_speed
from minipd.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.planner.kv_link import KVLink
from minipd.planner.latency_profile import LatencyProfile
from minipd.planner.local_prefill_policy import LocalPrefillThresholds
from minipd.planner.log_histogram import LogHistogram
from minipd.planner.sim_result import SimResult
from minipd.planner.simulator import Simulator
from minipd.planner.slo import SLO as SimSLO
from minipd.planner.step_jitter import SpeedTrace
from minipd.workload import ArrivalProcess, LengthDist, make_workload

LATENCY_TOLERANCE = 0.15
ATTAINMENT_TOLERANCE = 0.05
FLOAT_MARGIN = 1e-9
AUTO_SLO_PERCENTILE = 75
LOCALHOST_TCP_GBPS = 20.0  # KV over TCP on one host (bench.py transport); layer-wise, it hardly shows
LINK_SETUP_S = 0.001
WORKLOADS = {
    "prefill-heavy": {
        "prompt_len": LengthDist.uniform(256, 512),
        "output_len": LengthDist.uniform(8, 24),
        "rate": 1.6,
        "num_requests": 80,
    },
    "decode-heavy": {
        "prompt_len": LengthDist.uniform(24, 64),
        "output_len": LengthDist.uniform(64, 128),
        "rate": 2.5,
        "num_requests": 80,
    },
}
JITTER_SEEDS = 5  # the predicted simulation's figures are medians over this many jitter draws
CALIBRATION_SEED = 1000  # the calibration runs' workloads are drawn apart from the compared ones
METRICS = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms")
QUICK = {"model": "tiny", "repeats": 1, "num_requests": 12, "profile_quick": True}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_client_arguments(parser)
    parser.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="a latency profile (bench.py profile --json); without it one is measured first with the flags below",
    )
    parser.add_argument("--model", default="small", help="(default: %(default)s)")
    parser.add_argument("--dtype", default="float32", help="(default: %(default)s)")
    parser.add_argument("--torch-threads", type=int, default=1, help="per instance, and for the profile")
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="every instance's token budget")
    parser.add_argument("--num-blocks", type=int, default=1024, help="KV blocks per instance")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per workload")
    parser.add_argument("--num-requests", type=int, default=None, help="per workload (default: each one's)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--seed", type=int, default=0)
    options.add_slo_arguments(
        parser,
        "--goodput",
        None,
        f"the SLO of attainment (default: TTFT and TPOT at the simulated P{AUTO_SLO_PERCENTILE})",
    )
    parser.set_defaults(profile_quick=False)


def _profile(args: argparse.Namespace) -> LatencyProfile:
    if args.profile:
        return LatencyProfile.load(args.profile)
    measured = profile_bench.run(
        argparse.Namespace(
            model=args.model,
            dtype=args.dtype,
            device="cpu",
            torch_threads=args.torch_threads,
            repeats=5,
            num_blocks=args.num_blocks,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=64,
            quick=args.profile_quick,
        )
    )
    return LatencyProfile.from_json(json.dumps(measured))


def _specs(name: str, args: argparse.Namespace, seed: int):
    w = WORKLOADS[name]
    return make_workload(
        name,
        args.num_requests or w["num_requests"],
        ArrivalProcess.poisson(w["rate"]),
        seed=seed,
        prompt_len=w["prompt_len"],
        output_len=w["output_len"],
    )


def sim_options(profile: LatencyProfile, budget: int) -> SimOptions:
    """The 1P:1D cluster as the bench runs it: TCP KV on one host, every prompt to prefill."""
    return SimOptions(
        link=KVLink(LOCALHOST_TCP_GBPS, LINK_SETUP_S, True, profile.num_layers),
        local_prefill=LocalPrefillThresholds(max_local_tokens=0),
        max_batched_tokens=budget,
    )


def _simulated_figures(ttft_s: np.ndarray, gaps: LogHistogram) -> dict:
    """`METRICS` of simulated requests: their TTFTs (seconds) and every token gap."""
    return {
        "ttft_p50_ms": float(np.percentile(ttft_s, 50)) * MS_PER_S,
        "ttft_p90_ms": float(np.percentile(ttft_s, 90)) * MS_PER_S,
        "itl_p50_ms": gaps.percentile(50) * MS_PER_S,
        "itl_p90_ms": gaps.percentile(90) * MS_PER_S,
    }


def _measured_figures(records) -> dict:
    """`METRICS` of the successful ones of measured `records`."""
    ok = [r for r in records if r.success]
    gaps = [g * MS_PER_S for r in ok for g in r.itl_s]
    ttft = [r.ttft_s * MS_PER_S for r in ok]
    return {
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p90_ms": percentile(ttft, 90),
        "itl_p50_ms": percentile(gaps, 50),
        "itl_p90_ms": percentile(gaps, 90),
    }


def simulate(profile: LatencyProfile, specs, options: SimOptions) -> dict:
    """The simulated run: per-request arrays and the figures compared."""
    result = Simulator(profile, ClusterSpec.split(1, 1), options).run(specs)
    return {"result": result, **_simulated_figures(result.ttft_s, result.itl_gaps)}


def _sim_slo(sim: dict, given: list[str] | None) -> ClientSLO:
    if given:
        return options.slo_from(given)
    result = sim["result"]
    tpot = result.tpot_s[~np.isnan(result.tpot_s)]
    return ClientSLO(
        ttft_ms=round(float(np.percentile(result.ttft_s, AUTO_SLO_PERCENTILE)) * MS_PER_S, 1),
        tpot_ms=round(float(np.percentile(tpot, AUTO_SLO_PERCENTILE)) * MS_PER_S, 2),
    )


def _sim_attainment(sim: dict, slo: ClientSLO) -> float:
    def seconds(ms):
        return None if ms is None else ms / MS_PER_S

    return float(
        SimSLO(ttft_s=seconds(slo.ttft_ms), tpot_s=seconds(slo.tpot_ms), e2e_s=seconds(slo.e2el_ms))
        .good(sim["result"])
        .mean()
    )


def _measured(records, slo: ClientSLO) -> dict:
    return {
        **_measured_figures(records),
        "attainment": attainment(records, slo),
        "failed": sum(1 for r in records if not r.success),
    }


def _within(error: float, tolerance: float) -> bool:
    """|error| <= tolerance, up to float rounding: 80 requests move attainment in steps of
    1.25 points, and a difference of exactly 5 points is within 5."""
    return abs(error) <= tolerance + FLOAT_MARGIN


def _compare(sim: dict, meas: dict) -> dict:
    errors = {m: (sim[m] - meas[m]) / meas[m] if meas[m] else math.nan for m in METRICS}
    attain = sim["attainment"] - meas["attainment"]
    within = all(_within(e, LATENCY_TOLERANCE) for e in errors.values()) and _within(attain, ATTAINMENT_TOLERANCE)
    return {"relative_error": errors, "attainment_diff": attain, "within_targets": within}


def _profile_summary(profile: LatencyProfile) -> dict:
    return {
        "name": profile.name,
        "model": profile.model,
        "dtype": profile.dtype,
        "threads": profile.threads,
        "prefill": msgspec.to_builtins(profile.prefill),
        "decode": msgspec.to_builtins(profile.decode),
        "prefill_r2": profile.prefill_fit.r2 if profile.prefill_fit else None,
        "decode_r2": profile.decode_fit.r2 if profile.decode_fit else None,
        "prefill_steps": profile.prefill_fit.num_samples if profile.prefill_fit else None,
        "decode_steps": profile.decode_fit.num_samples if profile.decode_fit else None,
    }


class _StepLogs(NamedTuple):
    """The cluster's step logs, read for one stretch of a run."""

    directory: Path

    def steps(self, instance: str, run: RunResult) -> list[step_log_fit.Step]:
        end = run.started_clock_s + run.duration_s
        path = self.directory / f"{instance}.jsonl"
        return [s for s in step_log_fit.read_steps(path, since_s=run.started_clock_s) if s.start_s <= end]

    def speed_trace(self, profile: LatencyProfile, run: RunResult) -> SpeedTrace:
        """The run's machine speed against `profile`, per simulated instance (0: prefill, 1: decode)."""
        instances = {0: (self.steps("prefill-0", run), "prefill"), 1: (self.steps("decode-0", run), "decode")}
        return step_log_speed.speed_trace(profile, instances, origin_s=run.started_clock_s)


def _speed_summary(trace: SpeedTrace) -> dict:
    """Per role, the geometric mean, P10 and P90 of a run's speed factors (> 1: slower than
    fitted), the per-step spread, and how many points the trace has (0: no steps logged)."""
    out = {}
    for index, role in ((0, "prefill"), (1, "decode")):
        factors = np.array(trace.factors.get(index, (1.0,)))
        out[role] = {
            "mean": float(np.exp(np.log(factors).mean())),
            "p10": float(np.percentile(factors, 10)),
            "p90": float(np.percentile(factors, 90)),
            "sigma_step": trace.sigma_step.get(index, 0.0),
            "points": len(trace.factors.get(index, ())),
        }
    return out


def _predicted(profile: LatencyProfile, specs, options: SimOptions, jitter: dict, slo: ClientSLO) -> dict:
    """The simulation that knows nothing of the run: the fitted jitter, median figures over
    `JITTER_SEEDS` seeds."""
    runs = []
    for seed in range(JITTER_SEEDS):
        prefill, decode = jitter["prefill"].replace(seed=seed), jitter["decode"].replace(seed=seed)
        seeded = msgspec.structs.replace(options, prefill_jitter=prefill, decode_jitter=decode)
        sim = simulate(profile, specs, seeded)
        sim["attainment"] = _sim_attainment(sim, slo)
        runs.append(sim)
    return {m: float(np.median([r[m] for r in runs])) for m in (*METRICS, "attainment")}


class _Pooled(NamedTuple):
    """One run's simulated and measured requests, kept to pool a workload's runs."""

    sim: SimResult
    sim_attainment: float
    records: list[RequestRecord]
    attainment: float


def _pool(runs: list[_Pooled]) -> dict:
    """The comparison over every request of a workload's runs together (each judged against
    its own run's SLO): percentiles of all of them, and attainment as the share of all."""
    gaps = LogHistogram()
    for r in runs:
        gaps.add_histogram(r.sim.itl_gaps)
    n_sim = [r.sim.num_requests for r in runs]
    n_meas = [len(r.records) for r in runs]
    sim = {
        **_simulated_figures(np.concatenate([r.sim.ttft_s for r in runs]), gaps),
        "attainment": float(np.average([r.sim_attainment for r in runs], weights=n_sim)),
    }
    meas = {
        **_measured_figures([rec for r in runs for rec in r.records]),
        "attainment": float(np.average([r.attainment for r in runs], weights=n_meas)),
    }
    return {"num_requests": sum(n_meas), "simulated": sim, "measured": meas, **_compare(sim, meas)}


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    profile = _profile(args)
    budget = args.max_num_batched_tokens
    result = {
        "profile": _profile_summary(profile),
        "cluster": "1P:1D",
        "torch_threads": args.torch_threads,
        "max_num_batched_tokens": budget,
        "tolerance": {"latency": LATENCY_TOLERANCE, "attainment": ATTAINMENT_TOLERANCE},
        "workloads": {},
    }
    all_specs = {
        name: [_specs(name, args, args.seed + 100 * i + r) for r in range(args.repeats)]
        for i, name in enumerate(args.workloads)
    }
    calibration = {name: _specs(name, args, args.seed + CALIBRATION_SEED + i) for i, name in enumerate(args.workloads)}
    longest = [s for runs in all_specs.values() for specs in runs for s in specs]
    longest += [s for specs in calibration.values() for s in specs]
    args.tokenizer, args.dataset = None, None
    builder = options.prompt_builder(argparse.Namespace(model=profile.model, tokenizer=None, seed=args.seed))
    config = options.runner_config(args)
    with tempfile.TemporaryDirectory(prefix="minipd-steps-") as step_dir, Processes() as processes:
        logs = _StepLogs(Path(step_dir))
        server = ServerOptions(
            model=profile.model,
            torch_threads=args.torch_threads,
            max_model_len=options.fitting_max_model_len(longest),
            num_blocks=args.num_blocks,
            max_num_batched_tokens=budget,
            extra_flags=("--dtype", profile.dtype, "--no-prefix-caching", "--step-log-dir", step_dir),
        )
        deployment = start_disaggregated(
            processes, server, num_prefill=1, num_decode=1, router_flags=("--local-prefill-max-tokens", "-1")
        )
        calibrated = [  # steps at load, for the serving profile and its jitter only
            measure(deployment.urls, specs, builder, f"validate-calibrate-{name}", config).result
            for name, specs in calibration.items()
        ]
        serving = step_log_fit.refit(
            profile,
            step_log_fit.read_steps(logs.directory / "prefill-0.jsonl"),
            step_log_fit.read_steps(logs.directory / "decode-0.jsonl"),
        )
        result["serving_profile"] = _profile_summary(serving)
        jitter = {
            role: step_log_speed.fit_jitter(serving, [logs.steps(f"{role}-0", c) for c in calibrated], role)
            for role in ("prefill", "decode")
        }
        result["serving_jitter"] = {role: msgspec.to_builtins(j) for role, j in jitter.items()}
        plain = sim_options(serving, budget)
        probed = validate_probe.probe(
            deployment, serving, plain, builder, config, "validate-probe", lambda run: logs.speed_trace(serving, run)
        )
        result["serving_path_probe"] = probed.as_json()
        options_ = probed.apply(plain)
        in_process = sim_options(profile, budget)
        for name, runs in all_specs.items():
            rows, pooled = [], []
            for r, specs in enumerate(runs):
                measured = measure(deployment.urls, specs, builder, f"validate-{name}-{r}", config)
                trace = logs.speed_trace(serving, measured.result)
                sim = simulate(serving, specs, msgspec.structs.replace(options_, speed_trace=trace))
                slo = _sim_slo(sim, args.goodput)
                sim["attainment"] = _sim_attainment(sim, slo)
                predicted = _predicted(serving, specs, options_, jitter, slo)
                profile_only = simulate(profile, specs, in_process)
                profile_only["attainment"] = _sim_attainment(profile_only, slo)
                meas = {**_measured(measured.records, slo), "foreign_cpu": measured.foreign_cpu}
                pooled.append(_Pooled(sim["result"], sim["attainment"], measured.records, meas["attainment"]))
                rows.append(
                    {
                        "slo": msgspec.to_builtins(slo),
                        "speed": _speed_summary(trace),
                        "simulated": {k: v for k, v in sim.items() if k != "result"},
                        "simulated_predicted": predicted,
                        "simulated_profile_only": {k: v for k, v in profile_only.items() if k != "result"},
                        "measured": meas,
                        **_compare(sim, meas),
                        "predicted": _compare(predicted, meas),
                        "profile_only": _compare(profile_only, meas),
                    }
                )
            result["workloads"][name] = {
                **{k: msgspec.to_builtins(v) if isinstance(v, LengthDist) else v for k, v in WORKLOADS[name].items()},
                "num_requests": len(runs[0]),
                "runs": rows,
                "runs_within_targets": sum(row["within_targets"] for row in rows),
                "runs_within_targets_predicted": sum(row["predicted"]["within_targets"] for row in rows),
                "pooled": _pool(pooled),
            }
    result["lost_requests"] = sum(row["measured"]["failed"] for w in result["workloads"].values() for row in w["runs"])
    return result


def print_table(result: dict) -> None:
    p = result["profile"]
    print(
        f"validate: simulator vs a real 1P:1D cluster of {p['model']} ({p['dtype']}, {result['torch_threads']} "
        f"thread(s) per instance); profile {p['name']} (R^2 prefill {p['prefill_r2']}, decode {p['decode_r2']})"
    )
    for label, prof in (("in-process profile", p), ("serving profile", result["serving_profile"])):
        pre, dec = prof["prefill"], prof["decode"]
        steps = f", from {prof['prefill_steps']} + {prof['decode_steps']} steps" if label == "serving profile" else ""
        print(
            f"  {label}: prefill {pre['a'] * MS_PER_S:.1f} ms + {pre['b'] * MS_PER_S:.3f} ms/token + "
            f"{pre['c'] * 1e6:.3f} us/qk (R^2 {prof['prefill_r2']:.3f}); decode {dec['a'] * MS_PER_S:.1f} ms + "
            f"{dec['b'] * 1e6:.2f} us/ctx + {dec['c'] * MS_PER_S:.2f} ms/seq (R^2 {prof['decode_r2']:.3f}){steps}"
        )
    probe = result["serving_path_probe"]
    print(
        f"  serving-path probe ({probe['requests']} requests alone, {probe['prompt_len']} -> {probe['output_len']} "
        f"tokens): TTFT P50 {probe['measured_ttft_p50_ms']:.1f} ms measured, {probe['simulated_ttft_p50_ms']:.1f} "
        f"simulated -> request overhead {probe['request_overhead_ms']:.1f} ms; token gap P50 "
        f"{probe['measured_gap_p50_ms']:.1f} ms measured, {probe['simulated_gap_p50_ms']:.1f} simulated; first gap "
        f"P50 {probe['measured_first_gap_p50_ms']:.1f} ms -> decode join delay {probe['decode_join_delay_ms']:.1f} ms"
    )
    jitter = ", ".join(
        f"{role} {j['sigma_slow']:.3f} slow over {j['tau_s']:.2f} s + {j['sigma_step']:.3f} per step"
        for role, j in result["serving_jitter"].items()
    )
    print(f"  fitted jitter (std of log step time): {jitter}")
    print(
        "  simulated: with the run's measured speed; predicted: with the fitted jitter instead "
        f"(median of {JITTER_SEEDS} draws); profile only: the in-process profile"
    )
    print(
        f"{'workload':>13} {'run':>3} {'metric':>12} {'simulated':>10} {'measured':>10} {'error':>7} "
        f"{'predicted':>10} {'profile only':>13}"
    )
    for name, w in result["workloads"].items():
        for i, row in enumerate(w["runs"]):
            speed = ", ".join(
                f"{role} x{v['mean']:.2f} (P10-P90 {v['p10']:.2f}-{v['p90']:.2f})" for role, v in row["speed"].items()
            )
            print(f"{name:>13} {i:>3} speed against the fitted profile: {speed}")
            for m in METRICS:
                err = row["relative_error"][m]
                flag = "" if _within(err, result["tolerance"]["latency"]) else "  miss"
                print(
                    f"{name:>13} {i:>3} {m:>12} {row['simulated'][m]:>8.1f}ms {row['measured'][m]:>8.1f}ms "
                    f"{err:>+7.1%} {row['predicted']['relative_error'][m]:>+10.1%} "
                    f"{row['profile_only']['relative_error'][m]:>+13.1%}{flag}"
                )
            diff = row["attainment_diff"]
            flag = "" if _within(diff, result["tolerance"]["attainment"]) else "  miss"
            slo = " ".join(f"{k.removesuffix('_ms')}:{v:g}" for k, v in row["slo"].items())
            print(
                f"{name:>13} {i:>3} {'attainment':>12} {row['simulated']['attainment']:>10.1%} "
                f"{row['measured']['attainment']:>10.1%} {diff * 100:>+6.1f}pt "
                f"{row['predicted']['attainment_diff'] * 100:>+8.1f}pt "
                f"{row['profile_only']['attainment_diff'] * 100:>+11.1f}pt{flag}   (SLO {slo}; other jobs "
                f"{row['measured']['foreign_cpu']:.0%})"
            )
        print(
            f"{name:>13}: {w['runs_within_targets']} of {len(w['runs'])} runs within every target "
            f"({w['runs_within_targets_predicted']} predicted)"
        )
        pooled = w["pooled"]
        figures = ", ".join(
            f"{m.removesuffix('_ms')} {pooled['simulated'][m]:.1f}/{pooled['measured'][m]:.1f} ms "
            f"({pooled['relative_error'][m]:+.1%})"
            for m in METRICS
        )
        print(
            f"{name:>13}: the {pooled['num_requests']} requests of its runs together, simulated/measured: {figures}; "
            f"attainment {pooled['simulated']['attainment']:.1%}/{pooled['measured']['attainment']:.1%} "
            f"({pooled['attainment_diff'] * 100:+.1f}pt): {'within' if pooled['within_targets'] else 'outside'} "
            "the targets"
        )
    print(f"lost requests: {result['lost_requests']}")


def plot(result: dict, path: str) -> None:
    """A parity chart per workload: every run's simulated figure against its measured one
    (filled: at the run's measured speed; hollow: predicted), the ±15% band around y = x."""
    names = list(result["workloads"])
    fig, axes = subplots(ncols=len(names), width=5.5)
    from matplotlib.ticker import NullFormatter  # after subplots() has set matplotlib up headless

    markers = dict(zip(METRICS, "osD^"))
    for ax, name in zip(axes, names, strict=True):
        runs = result["workloads"][name]["runs"]
        values = [
            r[side][m] for r in runs for m in METRICS for side in ("measured", "simulated", "simulated_predicted")
        ]
        lo, hi = min(values) / 1.3, max(values) * 1.3
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
        ax.fill_between(
            [lo, hi],
            [lo * (1 - LATENCY_TOLERANCE), hi * (1 - LATENCY_TOLERANCE)],
            [lo * (1 + LATENCY_TOLERANCE), hi * (1 + LATENCY_TOLERANCE)],
            color="tab:green",
            alpha=0.15,
            label="±15%",
        )
        for m in METRICS:
            label = m.removesuffix("_ms").replace("_", " ")
            ax.scatter(
                [r["measured"][m] for r in runs],
                [r["simulated"][m] for r in runs],
                marker=markers[m],
                color="tab:blue",
                label=f"{label} (run's speed)",
            )
            ax.scatter(
                [r["measured"][m] for r in runs],
                [r["simulated_predicted"][m] for r in runs],
                marker=markers[m],
                facecolors="none",
                edgecolors="tab:orange",
                label=f"{label} (predicted)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())  # the minor ticks' labels overlap over a decade
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured (ms)")
        ax.set_ylabel("simulated (ms)")
        att = ", ".join(f"{r['simulated']['attainment']:.0%}/{r['measured']['attainment']:.0%}" for r in runs)
        ax.set_title(f"{name}: attainment sim/measured {att}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2)
    save(fig, path)
