"""The flags of the registry: where membership lives when it is not the embedded default
(minipd/ops/registry). Each entry names the config field it fills (`sets`), whose default it
takes (flag_fields.py)."""

from __future__ import annotations

import argparse

from minipd.entrypoints.flag_fields import flag_group
from minipd.entrypoints.flag_spec import EVERY_CHILD, NETWORKED
from minipd.ops.registry.etcd_url import DEFAULT_PREFIX, ETCD_PASSWORD_ENV, RegistryUrl, parse_registry_url

REGISTRY = "registry (docs/multi-host.md)"
MIN_TTL_S = 2  # etcd's own minimum lease TTL with its default election timeout


def registry_url(text: str) -> RegistryUrl:
    try:
        return parse_registry_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def ttl_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole seconds, got {text!r}") from None
    if value < MIN_TTL_S:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_TTL_S} (etcd's shortest lease), got {value}")
    return value


_registry = flag_group(NETWORKED, REGISTRY, EVERY_CHILD)

FLAGS = (
    _registry(
        "--registry",
        sets="process.registry",
        text=str,
        type=registry_url,
        metavar="etcd://HOST:PORT[,HOST:PORT...][/PREFIX]",
        help="keep the cluster's membership in etcd: instances publish themselves under a lease they keep alive, "
        "routers watch the prefix (no --prefill/--decode/--router needed) and claim role switches there. "
        f"Several endpoints: failover. PREFIX (default {DEFAULT_PREFIX}) separates clusters sharing one etcd. "
        f"etcd://USER@HOST:PORT logs in as USER, the password from ${ETCD_PASSWORD_ENV}. Needs the `etcd` extra "
        "(default: none; instances register with the router over its control port)",
    ),
    _registry(
        "--registry-ttl-s",
        sets="process.registry_ttl_s",
        type=ttl_seconds,
        help="with --registry: the TTL of each process's lease, refreshed every third of it. An instance that "
        "shows no sign of life for this long (dead, frozen, or cut off from etcd) is dropped by every router "
        "within about this time plus a second (default: %(default)s)",
    ),
    _registry(
        "--registry-ca",
        sets="process.registry_tls.ca",
        metavar="FILE",
        help="with --registry: talk TLS to etcd, checking its certificate against this CA (PEM; the etcd flag "
        "--trusted-ca-file's counterpart). Giving --registry-cert alone also turns TLS on, against the system's "
        "CAs (default: plain gRPC)",
    ),
    _registry(
        "--registry-cert",
        sets="process.registry_tls.cert",
        metavar="FILE",
        help="with --registry: the client certificate (PEM) this process presents to an etcd started with "
        "--client-cert-auth; with --registry-key (default: none)",
    ),
    _registry(
        "--registry-key",
        sets="process.registry_tls.key",
        metavar="FILE",
        help="with --registry-cert: its private key (PEM, readable by this process only) (default: none)",
    ),
)
