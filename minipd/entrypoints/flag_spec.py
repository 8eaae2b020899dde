"""What one command-line flag of `minipd` is (`Flag`), and the names the flag tables share:
the role sets, the --help groups, the environment variables of the secrets, and the parsers of
values that are more than a number.

A `Flag` says which roles' parsers have it, which child roles a launcher passes its parsed
value on to (`inherit`), and which config fields it sets (`sets`: paths such as
`engine.scheduler.max_num_seqs`, the first part naming a field of `configs.RoleConfigs`), so a
reader goes from a flag to the config it fills and `configs.py` fills it from there. A flag
with an `env` variable (the secrets) takes its default from that variable. The tables build
their entries with `flag_fields.flag`, which takes a flag's default and type from its field.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, NamedTuple

from minipd.api.allowed_hosts import parse_entries
from minipd.control.role import INSTANCE_ROLES, Role
from minipd.engine.cpu_placement import parse_cpu_list

ROLE_SUMMARIES = {
    Role.BOTH: "colocated instance: prefill and decode on one engine, with chunked prefill (the baseline)",
    Role.PREFILL: "prefill instance: computes prompts and streams their KV to decode instances, layer by layer",
    Role.DECODE: "decode instance: reserves blocks, receives the KV, decodes in continuous batches",
    Role.ROUTER: "router: picks instances, reserves before prefill, relays tokens (the KV never passes through it)",
    Role.CLUSTER: "launcher: a router plus prefill, decode and colocated instances as processes on this host",
}
COMMAND_ROLES = tuple(ROLE_SUMMARIES)

# the role sets a flag belongs to or is inherited by
ALL = frozenset(COMMAND_ROLES)
INSTANCES = frozenset(INSTANCE_ROLES)
ENGINE_ROLES = frozenset({*INSTANCE_ROLES, Role.CLUSTER})
EVERY_CHILD = frozenset({*INSTANCE_ROLES, Role.ROUTER})
NETWORKED = frozenset({*INSTANCE_ROLES, Role.ROUTER, Role.CLUSTER})
SERVING = frozenset({Role.BOTH, Role.ROUTER, Role.CLUSTER})
ROUTING = frozenset({Role.ROUTER, Role.CLUSTER})
DEMOS = frozenset({Role.BOTH, Role.CLUSTER})

# the sections of --help, in the order they first appear in the table
PROCESS, SECURITY, PLACEMENT, MODEL, SCHEDULER, INSTANCE, ROUTER, POLICY, CONTROLLER, HTTP, CLUSTER, DEMO = (
    "process",
    "security (docs/security.md)",
    "CPU placement",
    "model and KV cache",
    "scheduler",
    "instance (control plane and KV transport)",
    "router",
    "routing policy",
    "P:D ratio controller (moves instances between prefill and decode in place)",
    "OpenAI-compatible HTTP API",
    "local cluster",
    "prompts in, tokens and latencies out",
)

CLUSTER_SECRET_ENV = "MINIPD_CLUSTER_SECRET"
API_KEY_ENV = "MINIPD_API_KEY"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Flag(NamedTuple):
    name: str
    roles: frozenset[Role]  # the roles whose parser has this flag
    group: str  # its section in --help
    options: dict[str, Any]  # argparse keyword arguments
    sets: tuple[str, ...]  # the config fields its value goes to (configs.py)
    inherit: frozenset[Role] = frozenset()  # child roles a launcher passes the parsed value on to
    env: str | None = None  # the environment variable giving its default, and carrying it to children
    text: Callable[[Any], str] | None = None  # writes a parsed value back as it is typed

    @property
    def dest(self) -> str:
        return self.options.get("dest", self.name.lstrip("-").replace("-", "_"))


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


KV_TIER_SCHEMES = ("mooncake", "redis", "rediss", "unix")


def kv_tier_url(text: str) -> str:
    """`--kv-tier`: a store's URL by its scheme, or `mooncake` (the launcher's own master); the
    rest of the URL is checked when the tier is opened."""
    scheme, sep, rest = text.partition("://")
    if text == "mooncake" or (sep and rest and scheme in KV_TIER_SCHEMES):
        return text
    raise argparse.ArgumentTypeError(f"expected mooncake://HOST:PORT, redis://HOST:PORT/DB or mooncake, got {text!r}")


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def host_list(text: str) -> tuple[str, ...]:
    """`--allowed-hosts`: comma-separated entries, each checked (allowed_hosts.parse_entries)."""
    entries = tuple(e.strip() for e in text.split(",") if e.strip())
    try:
        parse_entries(entries)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("allowed_hosts: ")) from None
    return entries


def cpu_list(text: str) -> tuple[int, ...]:
    try:
        return parse_cpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("cpus: ")) from None
