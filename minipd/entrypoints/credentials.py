"""The secrets a process was given (`--cluster-secret`, `--api-key`), checked, and the warning
a process logs at start-up when it listens beyond this host without them."""

from __future__ import annotations

import ipaddress
import logging

from minipd.transports.shared_secret import SharedSecret

log = logging.getLogger(__name__)


def parse_cluster_secret(text: str | None) -> SharedSecret | None:
    """The cluster secret given as `text`, or None; raises ValueError naming the flag when it is too short."""
    if text is None:
        return None
    try:
        return SharedSecret.from_text(text)
    except ValueError as exc:
        raise ValueError(f"cluster_secret: {exc}") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def warn_if_exposed(what: str, host: str, secret: SharedSecret | None) -> None:
    """Log a warning when `what` listens on a non-loopback `host` without a cluster secret."""
    if secret is None and not is_loopback(host):
        log.warning(
            "%s listens on %s without a cluster secret: anyone who can reach it can reserve KV blocks, "
            "write KV into them (poisoning the prefix cache), register as an instance and receive prompts. "
            "Set --cluster-secret (or MINIPD_CLUSTER_SECRET) on every process of the cluster.",
            what,
            host,
        )


def warn_if_open_api(host: str, api_key: str | None) -> None:
    if api_key is None and not is_loopback(host):
        log.warning(
            "the OpenAI API listens on %s without an API key: anyone who can reach it can use it. "
            "Set --api-key (or MINIPD_API_KEY).",
            host,
        )
