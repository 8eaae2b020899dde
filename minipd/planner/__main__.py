"""`python -m minipd.planner [plan|day|calibrate-distserve] ...` (plan when no command is named)."""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "plan": ("minipd.planner.experiments.plan_command", "the best P:D split for a workload under SLOs"),
    "day": (
        "minipd.planner.experiments.day_command",
        "a shifting day-long workload: fixed ratio vs the ratio controller",
    ),
    "calibrate-distserve": ("minipd.planner.experiments.calibrate_command", "re-derive the distserve-13b-a100 profile"),
}


def main(argv: list[str] | None = None) -> int:
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["plan"] + argv
    parser = argparse.ArgumentParser(prog="python -m minipd.planner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    module = None
    for name, (module_name, summary) in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        if name == chosen:
            module = importlib.import_module(module_name)
            p.description = module.__doc__
            p.formatter_class = argparse.RawDescriptionHelpFormatter
            module.add_arguments(p)
    args = parser.parse_args(argv)
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
