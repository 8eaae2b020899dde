"""The `minipd` command: one binary, the role chosen by `--role` (flags in `flags.py`), or
`minipd plan|day|calibrate-distserve ...` for the planner (minipd/planner, docs/planner.md).

Every flag is checked before anything starts: a bad value exits with status 2 and a message
naming the flag. Then the role's runner (`roles.py`, or `process_cluster.py` for the launcher)
serves until SIGINT or SIGTERM, or answers `--prompt`s and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from minipd.control.role import Role
from minipd.entrypoints.flags import COMMAND_ROLES, build_parser
from minipd.planner.__main__ import COMMANDS as PLANNER_COMMANDS


def _role_of(argv: list[str]) -> Role | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--role", choices=[r.value for r in COMMAND_ROLES])
    known, _ = pre.parse_known_args(argv)
    return None if known.role is None else Role(known.role)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in PLANNER_COMMANDS:  # `minipd plan ...`: the planner, no serving role
        from minipd.planner.__main__ import main as planner_main

        return planner_main(argv)
    try:
        role = _role_of(argv)
    except SystemExit as exc:  # an unknown role: show the full usage
        build_parser(None).parse_args(argv)
        return int(exc.code or 2)
    parser = build_parser(role)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if getattr(args, "torch_threads", None):
        import torch

        torch.set_num_threads(args.torch_threads)
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency, but a plain asyncio loop works too
        uvloop = None
    run = uvloop.run if uvloop else asyncio.run
    from minipd.entrypoints.roles import prepare

    try:
        job = prepare(role, args)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return run(job)


if __name__ == "__main__":
    sys.exit(main())
