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
   step models are fitted to those steps (minipd.ops.planner.step_log_fit);
3. the probe (validate_probe.py) measures the fixed per-request latency outside the steps.
Then the compared runs, which neither fit saw. This machine's speed wanders (the same step
runs 10-30% slower or faster from one stretch of seconds to the next, whatever the cluster
does), so each compared run is simulated with the speed its instances ran at during it
(minipd.ops.planner.step_log_speed.speed_trace: each instance's logged steps against the fitted
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

The figures and targets are in validate_compare.py, the table and chart in validate_report.py.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np

from benchmarks.loadgen import options
from benchmarks.loadgen.deployments import ServerOptions, start_disaggregated
from benchmarks.loadgen.measure import MS_PER_S, measure
from benchmarks.loadgen.processes import Processes
from benchmarks.profile import profile_bench
from benchmarks.validate import validate_probe
from benchmarks.validate.validate_compare import (
    ATTAINMENT_TOLERANCE,
    JITTER_SEEDS,
    LATENCY_TOLERANCE,
    METRICS,
    Pooled,
    compare,
    measured_figures,
    pool,
    simulated_figures,
)
from benchmarks.validate.validate_report import plot, print_table, profile_summary  # noqa: F401 (bench.py calls the first two here)
from minipd.ops.loadgen.records import attainment
from minipd.ops.loadgen.runner import RunResult
from minipd.ops.planner import step_log_fit, step_log_speed
from minipd.ops.planner.cluster_spec import ClusterSpec, SimOptions
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.sim_summary import good_requests
from minipd.ops.planner.simulator import Simulator
from minipd.ops.planner.step_jitter import SpeedTrace
from minipd.ops.workload import ArrivalProcess, LengthDist, make_workload
from minipd.policy.local_prefill import LocalPrefillThresholds
from minipd.slo.latency import percentile
from minipd.slo.targets import SLO

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
CALIBRATION_SEED = 1000  # the calibration runs' workloads are drawn apart from the compared ones
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


def simulate(profile: LatencyProfile, specs, options: SimOptions) -> dict:
    """The simulated run: per-request arrays and the figures compared."""
    result = Simulator(profile, ClusterSpec.split(1, 1), options).run(specs)
    return {"result": result, **simulated_figures(result.ttft_s, result.itl_gaps)}


def _sim_slo(sim: dict, given: list[str] | None) -> SLO:
    """The given SLO, else TTFT and TPOT at the simulated `AUTO_SLO_PERCENTILE` (rounded to
    0.1 ms and 0.01 ms, as the results show them)."""
    if given:
        return options.slo_from(given)
    result = sim["result"]
    tpot = result.tpot_s[~np.isnan(result.tpot_s)]
    return SLO(
        ttft_s=round(percentile(result.ttft_s, AUTO_SLO_PERCENTILE) * MS_PER_S, 1) / MS_PER_S,
        tpot_s=round(percentile(tpot, AUTO_SLO_PERCENTILE) * MS_PER_S, 2) / MS_PER_S,
    )


def _sim_attainment(sim: dict, slo: SLO) -> float:
    return float(good_requests(sim["result"], slo).mean())


def _measured(records, slo: SLO) -> dict:
    return {
        **measured_figures(records),
        "attainment": attainment(records, slo),
        "failed": sum(1 for r in records if not r.success),
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


def _predicted(profile: LatencyProfile, specs, options: SimOptions, jitter: dict, slo: SLO) -> dict:
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


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    profile = _profile(args)
    budget = args.max_num_batched_tokens
    result = {
        "profile": profile_summary(profile),
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
        result["serving_profile"] = profile_summary(serving)
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
                pooled.append(Pooled(sim["result"], sim["attainment"], measured.records, meas["attainment"]))
                rows.append(
                    {
                        "slo": slo.as_ms(),
                        "speed": _speed_summary(trace),
                        "simulated": {k: v for k, v in sim.items() if k != "result"},
                        "simulated_predicted": predicted,
                        "simulated_profile_only": {k: v for k, v in profile_only.items() if k != "result"},
                        "measured": meas,
                        **compare(sim, meas),
                        "predicted": compare(predicted, meas),
                        "profile_only": compare(profile_only, meas),
                    }
                )
            result["workloads"][name] = {
                **{k: msgspec.to_builtins(v) if isinstance(v, LengthDist) else v for k, v in WORKLOADS[name].items()},
                "num_requests": len(runs[0]),
                "runs": rows,
                "runs_within_targets": sum(row["within_targets"] for row in rows),
                "runs_within_targets_predicted": sum(row["predicted"]["within_targets"] for row in rows),
                "pooled": pool(pooled),
            }
    result["lost_requests"] = sum(row["measured"]["failed"] for w in result["workloads"].values() for row in w["runs"])
    return result
