"""minipd experiments. Each subcommand prints a human table and can write machine-readable JSON.

    python bench.py engine --json engine.json
    python bench.py transport --json transport.json
    python bench.py overlap --json overlap.json
    python bench.py soak --json soak.json       # kills and freezes under load: nothing lost, nothing leaked

Every figure that depends on this machine's speed is reported next to a baseline measured
in the same run (memcpy, a raw socket, a raw model loop), because absolute numbers on a
shared machine are noise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# subcommand -> (module under benchmarks/ exposing add_arguments(parser), run(args) -> dict and
# print_table(result), one-line help). Modules are imported only when chosen, so one experiment's
# optional dependencies never stop another from running.
EXPERIMENTS = {
    "engine": ("benchmarks.engine_bench", "decode tokens/s: engine vs raw model loop vs transformers"),
    "transport": ("benchmarks.transport_bench", "KV transfer bandwidth of every backend vs memcpy and a raw socket"),
    "overlap": ("benchmarks.overlap_bench", "exposed KV transfer: layer-wise streaming vs send-after-prefill"),
    "soak": ("benchmarks.soak_bench", "a mixed workload under periodic kills and freezes: completed, failed, lost, "
                                      "leaked blocks"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if a in EXPERIMENTS), None)
    module = None
    for name, (module_name, summary) in EXPERIMENTS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
        if name == chosen:
            module = importlib.import_module(module_name)
            p.description = module.__doc__
            p.formatter_class = argparse.RawDescriptionHelpFormatter
            module.add_arguments(p)
    args = parser.parse_args(argv)
    result = module.run(args)
    module.print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
