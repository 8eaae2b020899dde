"""A flag declared from the config field it sets: `flag` builds a table entry (`flag_spec.Flag`)
whose default and value type come from that field, so a setting is declared once.

The first part of a `sets` path names a section of `configs.RoleConfigs`
(`config_sections.SECTIONS`: each to its default config), the rest a field inside it
(`engine.scheduler.max_num_seqs`). An entry that gives no `default` gets the field's default;
one that gives no `type` gets `int` or `float` for a field annotated so (or that or None), and
none for a `str` field (the text as typed; an `append` flag: each element of a list field). A
field of any other type needs the entry's own `type` (a parser whose error names the flag), and
a bool field an on/off `action` that leaves the field's default when the flag is absent, or the
table fails to build: nothing reaches a config as a string by accident. An entry overrides
`default` only where the flag's absence means more than the field's default (`--control-port`:
no control plane at all).
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Callable

import msgspec

from minipd.entrypoints.config_sections import SECTIONS
from minipd.entrypoints.flag_spec import Flag

# paths that name no field: the flag turns a config on (RoleConfigs.ratio_controller is None without it)
SWITCHES = frozenset({"ratio_controller.on"})
ON_OFF = ("store_true", "store_false")


def field_default(path: str) -> Any:
    """The default of the config field at `path` (a fresh one: a list default is not shared)."""
    return _field(path)[0]


def _field(path: str) -> tuple[Any, Any]:
    """The default of the config field at `path` and its annotated type (`int | None`, ...)."""
    section, *names = path.split(".")
    if section not in SECTIONS:
        raise AttributeError(f"{path}: no config section {section!r} (config_sections.SECTIONS)")
    value = SECTIONS[section]()
    annotation: Any = type(value)
    for name in names:
        if not hasattr(value, name):
            raise AttributeError(f"{path}: {type(value).__name__} has no field {name!r}")
        annotation = next(f.type for f in msgspec.structs.fields(annotation) if f.name == name)
        value = getattr(value, name)
    return value, annotation


def flag(
    name: str,
    *,
    sets: str | tuple[str, ...],
    help: str,
    roles,
    group: str,
    inherit=(),
    text: Callable[[Any], str] | None = None,
    env: str | None = None,
    **options: Any,
) -> Flag:
    """One table entry; `sets` is one config path or several (a value some configs share: the
    first gives the default and type). `options` are argparse's keyword arguments beyond those
    derived; `text` writes a parsed value back as typed, `env` names the variable giving the
    default (flag_spec.Flag)."""
    paths = (sets,) if isinstance(sets, str) else tuple(sets)
    if paths[0] not in SWITCHES:
        _derive(paths[0], options)
    options["help"] = help
    return Flag(name, frozenset(roles), group, options, paths, frozenset(inherit), env, text)


def _derive(path: str, options: dict[str, Any]) -> None:
    """Give `options` the default and type of the field at `path` where the entry gives none;
    TypeError or ValueError where the field and the entry disagree."""
    default, annotation = _field(path)
    action = options.get("action")
    if action in ON_OFF:
        # argparse's own default (False, or True for a --no- flag) must be what the field says
        if default is not (action == "store_false"):
            raise ValueError(f"{path}: {action} does not leave the field's default ({default!r}) when absent")
        return
    if annotation is bool:
        raise TypeError(f"{path} is a bool; its flag needs action store_true or store_false")
    options.setdefault("default", default)
    if "type" in options:
        return
    if action == "append" and typing.get_origin(annotation) is list:  # each value typed is one element
        (annotation,) = typing.get_args(annotation)
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    kinds = [a for a in (typing.get_args(annotation) if union else (annotation,)) if a is not type(None)]
    if kinds in ([int], [float]):
        options["type"] = kinds[0]
    elif kinds != [str]:  # a str field takes the text as typed
        raise TypeError(f"{path}: a field of type {annotation} needs the flag's own `type`, a parser of its text")


def flag_group(roles, group: str, inherit=()) -> Callable[..., Flag]:
    """`flag` with the roles, --help section and inheriting roles that a run of a table's
    entries share filled in; an entry may still give its own."""
    return functools.partial(flag, roles=roles, group=group, inherit=inherit)
