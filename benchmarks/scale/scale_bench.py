"""scale: the ratio controller scaling pools on Ray against switch-only, on a load that peaks.

Two `minipd --role cluster --launcher ray` clusters that start alike (`--num-prefill 2
--num-decode 1`, the pools bounded to 1..2 each, `--ratio-controller`) serve the same requests,
one after the other:
- **scale**: on a local Ray with room for one more instance (the launcher's own Ray, which
  gets the CPUs of every slot the bounds allow: the spare node of a real cluster), so when the
  controller wants another decode instance it adds one, and once the decode pool has been idle
  past `--scale-idle-window-s` it drains and removes one;
- **switch**: on a Ray with CPUs for exactly the three instances it starts (no spare), so the
  same want can only switch a prefill instance to decode, at the same peak load.

The load (sized for this 2-core machine as in `bench.py controller`: prefill bounded by every
instance's KV egress cap `--link-gbps`, decode by its KV pool `--num-blocks`, both clusters with
`--kv-admission-ratio 0` so a full pool queues rather than refuses):
1. *warm* — prefill-heavy requests, which 2P:1D serves;
2. *peak* — decode-heavy requests that need a second decode instance, *and* prefill-heavy ones
   that still need both prefill instances: switching one away breaks TTFT, adding one does not;
3. the load stops; each cluster's idle decode pool gives an instance back (the added one, or
   the switched one); a few *after* requests then check the smaller cluster serves.

Reported, per run: SLO attainment per phase and overall, P90 TTFT and TPOT, failed requests
(lost: there must be none), every scale event and role change with its time from the start,
and instance-seconds over the run (the cost: GPU-hours on a GPU cluster). The plot shows the
pool sizes over time and every request's TTFT and TPOT.

    python bench.py scale --json scale.json --plot scale.png
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import urllib.request
from typing import NamedTuple

import msgspec

from benchmarks.controller.controller_bench import CONTROLLER_FLAGS, QUEUE_ON_A_FULL_POOL, add_controller_arguments
from benchmarks.loadgen import options
from benchmarks.loadgen.deployments import start_server
from benchmarks.loadgen.measure import MS_PER_S, measure
from benchmarks.loadgen.plotting import save, slo_line, subplots
from benchmarks.loadgen.processes import Processes, minipd_command
from minipd.ops.loadgen.records import attainment
from minipd.ops.workload import ArrivalProcess, LengthDist, RequestSpec, make_workload


class Stream(NamedTuple):
    """Requests of one workload shape arriving as a Poisson process over [start_s, start_s + duration_s)."""

    phase: str
    workload: str
    rate: float
    start_s: float
    duration_s: float
    prompt_len: LengthDist
    output_len: LengthDist


PREFILL_HEAVY = (LengthDist.uniform(128, 256), LengthDist.uniform(8, 16))
DECODE_HEAVY = (LengthDist.uniform(24, 48), LengthDist.uniform(384, 512))
STREAMS = (
    Stream("warm", "prefill-heavy", 2.0, 0.0, 30.0, *PREFILL_HEAVY),
    # one decode instance holds ~3 of these answers and serves ~0.5 req/s, two ~1 req/s ...
    Stream("peak", "decode-heavy", 0.9, 30.0, 90.0, *DECODE_HEAVY),
    # ... while these prompts' KV alone takes more than one prefill instance's capped link
    Stream("peak", "prefill-heavy", 1.4, 30.0, 90.0, *PREFILL_HEAVY),
)
AFTER = Stream("after", "prefill-heavy", 1.0, 0.0, 8.0, *PREFILL_HEAVY)
PHASES = ("warm", "peak", "after")
DEFAULT_LINK_GBPS = 0.015  # as bench.py controller: ~0.8 s to send one 192-token prompt of `small`
DEFAULT_NUM_BLOCKS = 96
SCALE_FLAGS = {"scale_idle_window_s": 10.0, "scale_cooldown_s": 15.0}
BOUNDS = ("--min-prefill", "1", "--max-prefill", "2", "--min-decode", "1", "--max-decode", "2")
INSTANCES = 3  # at the start, in both runs; the scale run peaks at one more
MIN_DECODE = 1
QUICK_STREAMS = (
    Stream("warm", "prefill-heavy", 3.0, 0.0, 4.0, LengthDist.uniform(64, 128), LengthDist.uniform(8, 16)),
    Stream("peak", "decode-heavy", 3.0, 4.0, 6.0, LengthDist.uniform(24, 48), LengthDist.uniform(32, 64)),
)
QUICK_AFTER = AFTER._replace(rate=3.0, duration_s=1.0, prompt_len=LengthDist.uniform(64, 128))
QUICK = {
    "model": "tiny",
    "link_gbps": 0.002,
    "num_blocks": 128,
    # an ITL objective no token meets: the controller wants decode from its first decision, so
    # a seconds-long run shows an add (scale) and a switch (switch) every time
    "controller_slo": ["ttft:60000", "itl:1"],
    "window_s": 2.0,
    "cooldown_s": 1.0,
    "min_samples": 5,
    "interval_s": 0.25,
    "hysteresis": 0.05,
    "scale_idle_window_s": 3.0,
    "scale_cooldown_s": 1.0,
}
RUNS = ("switch", "scale")
ADMIN_TIMEOUT_S = 30.0
SCALE_IN_BOUND_S = 180.0  # the idle window, the cool-down, a drain and a process stop, on a busy machine
POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_client_arguments(parser)
    options.add_server_arguments(parser, default_model="small")
    parser.set_defaults(num_blocks=DEFAULT_NUM_BLOCKS)
    g = parser.add_argument_group("clusters, controller and scaling")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--link-gbps", type=float, default=DEFAULT_LINK_GBPS, help="every instance's KV egress cap")
    add_controller_arguments(parser, g, {**CONTROLLER_FLAGS, **SCALE_FLAGS})


def requests_of(streams, seed: int) -> tuple[list[RequestSpec], list[str]]:
    """Every stream's requests, by arrival, and each one's phase."""
    tagged = []
    for i, s in enumerate(streams):
        part = make_workload(
            s.workload,
            max(1, round(s.rate * s.duration_s)),
            ArrivalProcess.poisson(s.rate),
            seed=seed + i,
            prompt_len=s.prompt_len,
            output_len=s.output_len,
        )
        tagged += [(spec._replace(arrival_s=spec.arrival_s + s.start_s), s.phase) for spec in part]
    tagged.sort(key=lambda pair: pair[0].arrival_s)
    return [spec for spec, _ in tagged], [phase for _, phase in tagged]


def cluster_argv(args: argparse.Namespace, server, ray_address: str | None) -> list[str]:
    argv = [
        *minipd_command(),
        "--role", "cluster", "--launcher", "ray", "--http-port", "0",
        "--num-prefill", "2", "--num-decode", "1", *BOUNDS,
        "--transport", server.transport, "--link-gbps", f"{args.link_gbps:g}",
        *server.engine_flags(), *QUEUE_ON_A_FULL_POOL,
        "--ratio-controller", "--controller-slo", *args.controller_slo,
    ]  # fmt: skip
    for field in CONTROLLER_FLAGS:
        argv += [f"--controller-{field.replace('_', '-')}", str(getattr(args, field))]
    for field in SCALE_FLAGS:
        argv += [f"--{field.replace('_', '-')}", str(getattr(args, field))]
    return argv + (["--ray-address", ray_address] if ray_address else [])


def admin_instances(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/admin/instances", timeout=ADMIN_TIMEOUT_S) as response:
        return json.loads(response.read())


def wait_scaled_in(url: str, timeout_s: float) -> dict:
    """/admin/instances once the decode pool, idle since the load stopped, gave an instance
    back (the added one, or the one switched in), or is at its minimum with no scale event
    pending (or `timeout_s` passed: the caller reports what it saw)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = admin_instances(url)
        events = view["scale_events"]
        removed = any((e["action"], e["role"], e["state"]) == ("remove", "decode", "removed") for e in events)
        pending = [e for e in events if e["state"] not in ("added", "removed", "failed")]
        at_min = view["pools"]["decode"] <= MIN_DECODE and not pending
        if removed or at_min or time.monotonic() > deadline:
            return view
        time.sleep(POLL_S)  # polling the router's view, bounded by the deadline


def pool_sizes(view: dict, start_wall: float, end_s: float) -> dict:
    """Each pool's size over [0, end_s] (s from the run's start) as step points, from the role
    changes (at their end) and the scale events (an add counts once added, a remove until done)."""
    changes = []
    for c in view["role_changes"]:
        changes.append((c["decided_at"] + c["total_s"] - start_wall, c["from_role"], c["to_role"]))
    for e in view["scale_events"]:
        if e["state"] in ("added", "removed"):
            at = e["decided_at"] + e["total_s"] - start_wall
            changes.append((at, None, e["role"]) if e["action"] == "add" else (at, e["role"], None))
    sizes = {"prefill": 2, "decode": 1}
    times, series = [0.0], {role: [n] for role, n in sizes.items()}
    for at, left, joined in sorted(changes, key=lambda c: c[0]):
        for role, step in ((left, -1), (joined, 1)):
            if role in sizes:
                sizes[role] += step
        times.append(max(0.0, at))
        for role in sizes:
            series[role].append(sizes[role])
    times.append(max(end_s, times[-1]))
    for role in sizes:
        series[role].append(sizes[role])
    return {"t": times, **series}


def instance_seconds(sizes: dict, end_s: float) -> float:
    """The integral of the instance count over [0, end_s]."""
    total, t = 0.0, sizes["t"]
    for i in range(len(t) - 1):
        lo, hi = min(t[i], end_s), min(t[i + 1], end_s)
        total += (hi - lo) * (sizes["prefill"][i] + sizes["decode"][i])
    return total


def run_one(name: str, args, server, specs, phases, after, builder, config, slo, ray_address) -> dict:
    with Processes(f"scale-bench-{name}") as processes:
        url = start_server(processes, f"{name}-cluster", cluster_argv(args, server, ray_address))
        measured = measure([url], specs, builder, f"scale-bench-{name}", config, slo)
        start_wall = time.time() - measured.result.duration_s  # the run's clock started with its first request
        end_s = measured.result.duration_s
        scaled_in = wait_scaled_in(url, SCALE_IN_BOUND_S)
        after_measured = measure([url], after, builder, f"scale-bench-{name}-after", config, slo)
        view = admin_instances(url)
    records = sorted(measured.records, key=lambda r: r.index) + sorted(after_measured.records, key=lambda r: r.index)
    phase_of = phases + ["after"] * len(after)
    sizes = pool_sizes(view, start_wall, end_s)
    return {
        "attainment": {
            phase: attainment([r for r, p in zip(records, phase_of) if p == phase], slo) for phase in PHASES
        },
        "attainment_run": attainment(records[: len(specs)], slo),
        "failed": sum(not r.success for r in records),
        "errors": sorted({r.error or "unknown" for r in records if not r.success}),
        "p90_ttft_ms": measured.p90_ttft_ms(),
        "p90_itl_ms": measured.p90_itl_ms(),
        "foreign_cpu": measured.foreign_cpu,
        "duration_s": end_s,
        "instance_seconds": instance_seconds(sizes, end_s),
        "peak_instances": max(p + d for p, d in zip(sizes["prefill"], sizes["decode"])),
        "pools_after_scale_in": scaled_in["pools"],
        "pool_sizes": sizes,
        "scale_events": [
            {"t": e["decided_at"] - start_wall, **{k: e[k] for k in ("action", "role", "instance", "state", "total_s")}}
            for e in view["scale_events"]
        ],
        "role_changes": [
            {
                "t": c["decided_at"] - start_wall,
                "instance": c["instance_id"],
                "from": c["from_role"],
                "to": c["to_role"],
                "switch_s": c["total_s"],
            }
            for c in view["role_changes"]
        ],  # fmt: skip
        "requests": {
            "phase": phase_of[: len(specs)],
            "sent_s": [r.sent_s for r in records[: len(specs)]],
            "ttft_ms": [r.ttft_s * MS_PER_S for r in records[: len(specs)]],
            "tpot_ms": [r.tpot_s * MS_PER_S for r in records[: len(specs)]],
            "success": [r.success for r in records[: len(specs)]],
        },
    }


class _NoSpareRay:
    """A local Ray with CPUs for the `INSTANCES` instances the switch run starts, and no more."""

    def __enter__(self) -> str:
        import ray  # only this run needs it here; the launcher imports its own

        self.ray, self.temp_dir = ray, tempfile.mkdtemp(prefix="minipd-scale-bench-ray-")
        context = ray.init(num_cpus=INSTANCES, _temp_dir=self.temp_dir, namespace="minipd-scale-bench")
        return context.address_info["gcs_address"]

    def __exit__(self, *exc) -> None:
        self.ray.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def run(args: argparse.Namespace) -> dict:
    streams, after_stream = STREAMS, AFTER
    if args.quick:
        vars(args).update(QUICK)
        streams, after_stream = QUICK_STREAMS, QUICK_AFTER
    args.tokenizer = None
    slo = options.slo_from(args.goodput)
    specs, phases = requests_of(streams, args.seed)
    after, _ = requests_of([after_stream], args.seed + len(streams))
    builder = options.prompt_builder(args)
    config = options.runner_config(args)
    server = options.server_options(args, specs + after)
    result = {
        "model": args.model,
        "num_requests": len(specs),
        "num_after": len(after),
        "streams": [
            {**s._asdict(), **{k: msgspec.to_builtins(getattr(s, k)) for k in ("prompt_len", "output_len")}}
            for s in (*streams, after_stream)
        ],  # fmt: skip
        "link_gbps": args.link_gbps,
        "num_blocks": server.num_blocks,
        "torch_threads": args.torch_threads,
        "slo": slo.as_ms(),
        "controller": {"slo": args.controller_slo, **{f: getattr(args, f) for f in (*CONTROLLER_FLAGS, *SCALE_FLAGS)}},
        "bounds": " ".join(BOUNDS),
    }
    with _NoSpareRay() as no_spare:
        result["switch"] = run_one("switch", args, server, specs, phases, after, builder, config, slo, no_spare)
    result["scale"] = run_one("scale", args, server, specs, phases, after, builder, config, slo, None)
    result["lost_requests"] = result["switch"]["failed"] + result["scale"]["failed"]
    result["scale_beats_switch_at_peak"] = (
        result["scale"]["attainment"]["peak"] > result["switch"]["attainment"]["peak"]
    )
    return result


def print_table(result: dict) -> None:
    slo_text = " ".join(f"{key.removesuffix('_ms')}:{value:g}" for key, value in result["slo"].items())
    print(
        f"scale: {result['model']}, {result['num_requests']} requests (warm, then peak) and {result['num_after']} "
        f"after; both clusters start 2P:1D ({result['bounds']}), KV egress {result['link_gbps'] * 1e3:g} Mbit/s, "
        f"{result['num_blocks']} KV blocks each; SLO {slo_text}"
    )
    print(
        f"{'run':>7} {'warm':>6} {'peak':>6} {'after':>6} {'run':>6} {'failed':>6} {'P90 TTFT':>9} {'P90 ITL':>8} "
        f"{'peak size':>9} {'inst-s':>7} {'other jobs':>10}"
    )
    for name in RUNS:
        r = result[name]
        a = r["attainment"]
        print(
            f"{name:>7} {a['warm']:>6.0%} {a['peak']:>6.0%} {a['after']:>6.0%} {r['attainment_run']:>6.0%} "
            f"{r['failed']:>6} {r['p90_ttft_ms']:>7.0f}ms {r['p90_itl_ms']:>6.1f}ms {r['peak_instances']:>9} "
            f"{r['instance_seconds']:>7.0f} {r['foreign_cpu']:>10.0%}"
        )
        for e in r["scale_events"]:
            what = f"{e['action']} {e['role']} {e['instance']}: {e['state']}"
            print(f"  {name}: t={e['t']:6.1f}s {what} in {e['total_s']:.1f} s")
        for c in r["role_changes"]:
            print(f"  {name}: t={c['t']:6.1f}s {c['instance']}: {c['from']} -> {c['to']} ({c['switch_s']:.2f} s)")
    verdict = "beats" if result["scale_beats_switch_at_peak"] else "does NOT beat"
    print(f"at the peak, scaling {verdict} switch-only; lost requests: {result['lost_requests']}")


def plot(result: dict, path: str) -> None:
    fig, (pools_ax, ttft_ax, tpot_ax) = subplots(nrows=3, width=8.0, height=2.6)
    styles = {"switch": ("tab:red", "x", ":"), "scale": ("tab:blue", ".", "-")}
    for name, (color, marker, line) in styles.items():
        r = result[name]
        sizes = r["pool_sizes"]
        pools_ax.step(sizes["t"], sizes["decode"], where="post", color=color, linestyle=line, label=f"{name}: decode")
        pools_ax.step(sizes["t"], [p + d for p, d in zip(sizes["prefill"], sizes["decode"])], where="post",
                      color=color, linestyle=line, alpha=0.4, label=f"{name}: all instances")  # fmt: skip
        q = r["requests"]
        ok = [i for i, s in enumerate(q["success"]) if s]
        for ax, key in ((ttft_ax, "ttft_ms"), (tpot_ax, "tpot_ms")):
            ax.scatter([q["sent_s"][i] for i in ok], [q[key][i] for i in ok], s=8, c=color, marker=marker, label=name)
    slo_line(ttft_ax, result["slo"].get("ttft_ms"), "TTFT SLO")
    slo_line(tpot_ax, result["slo"].get("tpot_ms"), "TPOT SLO")
    pools_ax.set_ylabel("instances")
    ttft_ax.set_yscale("log")
    ttft_ax.set_ylabel("TTFT (ms)")
    tpot_ax.set_ylabel("TPOT (ms)")
    tpot_ax.set_xlabel("request sent at (s from the start of the run)")
    peak = next((s for s in result["streams"] if s["phase"] == "peak"), None)
    for ax in (pools_ax, ttft_ax, tpot_ax):
        if peak is not None:
            ax.axvspan(peak["start_s"], peak["start_s"] + peak["duration_s"], color="grey", alpha=0.1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    a = {name: result[name]["attainment"]["peak"] for name in RUNS}
    pools_ax.set_title(
        f"scale vs switch-only (shaded: the peak); peak attainment switch {a['switch']:.0%}, scale {a['scale']:.0%}; "
        f"instance-s {result['switch']['instance_seconds']:.0f} vs {result['scale']['instance_seconds']:.0f}",
        fontsize=9,
    )
    save(fig, path)
