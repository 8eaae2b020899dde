"""minipd experiments. Each subcommand prints a human table and can write machine-readable JSON
(`--json FILE`) and a plot (`--plot FILE.png`).

    python bench.py engine --json engine.json
    python bench.py transport --json transport.json
    python bench.py overlap --json overlap.json
    python bench.py neighbour --json neighbour.json
    python bench.py profile --json profile.json
    python bench.py serve --url http://127.0.0.1:8000 --request-rate 1 --goodput ttft:2000 tpot:50
    python bench.py slo --json slo.json --plot slo.png
    python bench.py linkbw --json linkbw.json --plot linkbw.png
    python bench.py crossover --json crossover.json --plot crossover.png
    python bench.py switch --json switch.json --plot switch.png
    python bench.py controller --json controller.json --plot controller.png
    python bench.py scale --json scale.json --plot scale.png  # on Ray: scaling pools vs switch-only
    python bench.py validate --profile profile.json --json validate.json --plot validate.png
    python bench.py soak --json soak.json       # kills and freezes under load: nothing lost, nothing leaked
    python bench.py tracing --json tracing.json  # --otlp-traces-endpoint on vs off at slo's load
    python bench.py peer --peer-url http://127.0.0.1:8080 --json peer.json --plot peer.png  # minipd / llama-server
    python bench.py dashboard --json dashboard.json --plot grafana_panels.png  # a real Prometheus, every panel
    python bench.py footprint --json footprint.json --plot footprint.png  # what one streamed chat runs
    python bench.py events --json events.json --plot events.png  # the request event seam's cost per request
    python bench.py kvtier --json kvtier.json --plot kvtier.png  # multi-turn chat with and without the KV tier
    python bench.py kvtier-ops --json kvtier-ops.json  # the KV tier's calls; fetch vs recompute

Every figure that depends on this machine's speed is reported next to a baseline measured
in the same run (memcpy, a raw socket, a raw model loop), because absolute numbers on a
shared machine are noise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import signal
import sys

from minipd.entrypoints import openmp_env

# subcommand -> (module in benchmarks/<subcommand>/ exposing add_arguments(parser), run(args) -> dict and
# print_table(result), one-line help). Modules are imported only when chosen, so one experiment's
# optional dependencies never stop another from running.
EXPERIMENTS = {
    "engine": (
        "benchmarks.engine.engine_bench",
        "serving tok/s vs HF static batches, decode step vs its floor, bf16 vs fp32",
    ),
    "transport": (
        "benchmarks.transport.transport_bench",
        "KV transfer bandwidth of every backend vs memcpy and a raw socket",
    ),
    "overlap": ("benchmarks.overlap.overlap_bench", "exposed KV transfer: layer-wise streaming vs send-after-prefill"),
    "neighbour": ("benchmarks.neighbour.neighbour_bench", "colocated decode ITL with a CPU-burning neighbour process"),
    "profile": ("benchmarks.profile.profile_bench", "prefill/decode step times fitted into a planner latency profile"),
    "serve": (
        "benchmarks.serve.serve_bench",
        "one workload at one rate against an OpenAI endpoint: vLLM's serving summary",
    ),
    "slo": ("benchmarks.slo.slo_bench", "SLO attainment and goodput vs request rate: colocated vs disaggregated"),
    "linkbw": (
        "benchmarks.linkbw.linkbw_bench",
        "TTFT and SLO attainment vs KV link bandwidth (token bucket, shaped veth)",
    ),
    "crossover": (
        "benchmarks.crossover.crossover_bench",
        "per prompt length, the link bandwidth where KV transfer cost equals prefill interference",
    ),
    "switch": (
        "benchmarks.switch.switch_bench",
        "an in-place role switch: decision to serving, drain excluded and included",
    ),
    "controller": (
        "benchmarks.controller.controller_bench",
        "the live P:D ratio controller against a fixed ratio, shift workload",
    ),
    "scale": (
        "benchmarks.scale.scale_bench",
        "the controller scaling pools on Ray (a spare) against switch-only (no spare), on a load that peaks",
    ),
    "validate": (
        "benchmarks.validate.validate_bench",
        "the planner's simulator against a real 1P:1D cluster, same workloads",
    ),
    "soak": (
        "benchmarks.soak.soak_bench",
        "a mixed workload under periodic kills and freezes: completed, failed, lost, leaked blocks",
    ),
    "peer": (
        "benchmarks.peer.peer_bench",
        "the same workloads against minipd and another OpenAI server (llama-server), as ratios",
    ),
    "tracing": ("benchmarks.tracing.tracing_bench", "what --otlp-traces-endpoint costs at slo's load: on vs off"),
    "dashboard": (
        "benchmarks.dashboard.dashboard_bench",
        "the Grafana dashboard's panels over a live cluster, scraped by a real Prometheus, drawn as a grid",
    ),
    "events": (
        "benchmarks.events.events_bench",
        "what the request event seam costs a request, with no subscriber and with one of every kind",
    ),
    "footprint": (
        "benchmarks.footprint.footprint_bench",
        "the files and lines of minipd one streamed chat runs, in every process of a local cluster",
    ),
    "kvtier": (
        "benchmarks.kvtier.multiturn_bench",
        "multi-turn chat on several instances: prompt tokens computed and TTFT without a tier, "
        "cache-aware, and with the shared KV tier",
    ),
    "kvtier-ops": (
        "benchmarks.kvtier.kvtier_bench",
        "the shared KV tier's store, lookup and fetch on each store (fake, Redis, Mooncake) vs memcpy, "
        "and fetching a prefix against computing it, over its length (the break-even)",
    ),
    "viewers": (
        "benchmarks.viewers.viewers_bench",
        "what dashboard viewers cost the router: CPU, and TTFT/ITL at slo's load",
    ),
}


def _finite_or_null(value):
    """NaN and infinities (no samples, no crossing) as JSON null, so the file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def _interrupt_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # so every `finally` runs: started servers and namespaces are removed


def build_parser(chosen: str | None):
    """The command line, with every flag of experiment `chosen` (its module imported; the others
    know only --json): (the parser, the chosen experiment's subparser, its module), the last two
    None when none is chosen. tests/unit/test_docs.py checks the docs' commands against it."""
    parser = argparse.ArgumentParser(
        prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    module = chosen_parser = None
    for name, (module_name, summary) in EXPERIMENTS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
        if name == chosen:
            module = importlib.import_module(module_name)
            p.description = module.__doc__
            p.formatter_class = argparse.RawDescriptionHelpFormatter
            module.add_arguments(p)
            if hasattr(module, "plot"):
                p.add_argument("--plot", metavar="FILE.png", help="draw the results into this PNG file")
            chosen_parser = p
    return parser, chosen_parser, module


def main(argv: list[str] | None = None) -> int:
    # Idle OpenMP threads sleep, as in every minipd process; set before any experiment loads torch.
    openmp_env.prefer_passive_waiting()
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if a in EXPERIMENTS), None)
    parser, _, module = build_parser(chosen)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    try:
        result = module.run(args)
    except ValueError as exc:  # a bad flag value, named by the message
        parser.error(str(exc))
    module.print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_finite_or_null(result), f, indent=2, sort_keys=True, allow_nan=False)
        print(f"wrote {args.json}")
    if getattr(args, "plot", None):
        module.plot(result, args.plot)
    return 1 if result.get("checks_failed") else 0  # an experiment's own pass/fail checks


if __name__ == "__main__":
    sys.exit(main())
