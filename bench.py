"""minipd experiments. Each subcommand prints a human table and can write machine-readable JSON.

    python bench.py engine --json engine.json
    python bench.py transport --json transport.json

Every figure that depends on this machine's speed is reported next to a baseline measured
in the same run (memcpy, a raw socket, a raw model loop), because absolute numbers on a
shared machine are noise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# subcommand -> module under benchmarks/ exposing add_arguments(parser), run(args) -> dict,
# and print_table(result)
EXPERIMENTS = {
    "engine": "benchmarks.engine_bench",
    "transport": "benchmarks.transport_bench",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    modules = {}
    for name, module_name in EXPERIMENTS.items():
        module = importlib.import_module(module_name)
        modules[name] = module
        p = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
        module.add_arguments(p)
    args = parser.parse_args(argv)
    module = modules[args.experiment]
    result = module.run(args)
    module.print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
