"""`python -m minipd.ops.planner [plan|day|calibrate-distserve] ...` (plan when no command is named)."""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "plan": ("minipd.ops.planner.experiments.plan_command", "the best P:D split for a workload under SLOs"),
    "day": (
        "minipd.ops.planner.experiments.day_command",
        "a shifting day-long workload: fixed ratio vs the ratio controller",
    ),
    "calibrate-distserve": (
        "minipd.ops.planner.experiments.calibrate_command",
        "re-derive the distserve-13b-a100 profile",
    ),
}


def build_parser(chosen: str | None):
    """The command line, with every flag of command `chosen` (its module imported): (the parser,
    the chosen command's subparser, its module), the last two None when none is chosen."""
    import importlib

    parser = argparse.ArgumentParser(prog="python -m minipd.ops.planner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    module = chosen_parser = None
    for name, (module_name, summary) in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        if name == chosen:
            module = importlib.import_module(module_name)
            p.description = module.__doc__
            p.formatter_class = argparse.RawDescriptionHelpFormatter
            module.add_arguments(p)
            chosen_parser = p
    return parser, chosen_parser, module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["plan"] + argv
    parser, _, module = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
