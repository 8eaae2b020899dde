"""A KV tier by URL: the store's scheme picks the backend, imported only when chosen (a missing
optional package matters only to the store that needs it).

- `mooncake://HOST:PORT`: a Mooncake master's RPC address. Query parameters, all optional:
  `metadata` (the HTTP metadata server's URL; default `http://HOST:PORT+1/metadata`, where the
  local master serves it: `mooncake_master.py`), `local_hostname` (the address other clients
  reach this one at; default this host's address on the route to the master), `segment_mib`
  (memory this client contributes to the store, default 256), `buffer_mib` (its own buffer, 16),
  `staging_mib` (the staging arena fetches pass through, 64), `protocol` (`tcp`), `rdma_devices`.
- `redis://HOST:PORT/DB` (or `rediss://`, `unix://`): a Redis server, as redis-py reads the URL.
- `fake://`: an in-process dict, for unit tests only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from minipd.kvtier.fake_backend import FakeBackend
from minipd.kvtier.mooncake_backend import (
    MooncakeBackend,
    MooncakeError,
    MooncakeSettings,
)  # mooncake itself: in open()
from minipd.kvtier.tier import KVTier, TierSettings

if TYPE_CHECKING:
    from minipd.kvtier.redis_backend import RedisBackend

MIB = 1 << 20
MOONCAKE_DEFAULTS = {"segment_mib": 256, "buffer_mib": 16, "staging_mib": 64}
MOONCAKE_PARAMS = {"metadata", "local_hostname", "protocol", "rdma_devices", *MOONCAKE_DEFAULTS}
REDIS_SCHEMES = ("redis", "rediss", "unix")


class MissingKVTierPackage(ImportError):
    """The chosen store's client package is not installed."""


class KVTierUnavailable(RuntimeError):
    """The store did not answer when the tier was opened."""


async def open_kv_tier(
    url: str,
    model_digest: bytes,
    block_size: int,
    settings: TierSettings = TierSettings(),
) -> KVTier:
    """Connect to the store at `url` within `settings.setup_timeout_s`: KVTierUnavailable if it
    does not answer, MissingKVTierPackage if its client is not installed, ValueError for a bad
    URL. (Once open, the tier's calls never raise for the store: `tier.KVTier`.)"""
    scheme = urlsplit(url).scheme
    if scheme == "mooncake":
        mooncake = parse_mooncake_url(url)  # a bad URL is a ValueError before a missing package is mentioned
        _require("mooncake", "mooncake-transfer-engine-non-cuda")
        try:
            backend = await MooncakeBackend.open(mooncake, settings.setup_timeout_s)
        except MooncakeError as exc:
            raise KVTierUnavailable(str(exc)) from exc
    elif scheme in REDIS_SCHEMES:
        _require("redis", "redis")
        from minipd.kvtier.redis_backend import RedisBackend

        backend = RedisBackend(url, settings.timeout_s)
        await _check_redis(backend, url, settings.setup_timeout_s)
    elif scheme == "fake":
        backend = FakeBackend()
    else:
        raise ValueError(f"KV tier URL {url!r}: the scheme must be mooncake, redis, rediss or unix")
    return KVTier(backend, model_digest, block_size, settings)


def parse_mooncake_url(url: str) -> MooncakeSettings:
    """`mooncake://HOST:PORT?...` as the client's settings (see the module's docstring)."""
    parts = urlsplit(url)
    if parts.scheme != "mooncake" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise ValueError(f"KV tier URL {url!r}: expected mooncake://HOST:PORT[?PARAMETERS]")
    query = {name: values[-1] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = set(query) - MOONCAKE_PARAMS
    if unknown:
        raise ValueError(f"KV tier URL {url!r}: unknown parameters {sorted(unknown)}; known: {sorted(MOONCAKE_PARAMS)}")
    sizes = {}
    for name, default in MOONCAKE_DEFAULTS.items():
        try:
            sizes[name] = int(query.get(name, default)) * MIB
        except ValueError:
            raise ValueError(f"KV tier URL {url!r}: {name} must be a whole number of MiB") from None
        if sizes[name] <= 0:
            raise ValueError(f"KV tier URL {url!r}: {name} must be positive")
    host, port = parts.hostname, parts.port
    netloc_host = f"[{host}]" if ":" in host else host  # an IPv6 address, as URLs write it
    return MooncakeSettings(
        master=f"{netloc_host}:{port}",
        metadata=query.get("metadata") or f"http://{netloc_host}:{port + 1}/metadata",
        local_hostname=query.get("local_hostname") or route_address(host, port),
        segment_bytes=sizes["segment_mib"],
        local_buffer_bytes=sizes["buffer_mib"],
        staging_bytes=sizes["staging_mib"],
        protocol=query.get("protocol") or "tcp",
        rdma_devices=query.get("rdma_devices", ""),
    )


def route_address(host: str, port: int) -> str:
    """This host's address on the route to `host` (a UDP socket's connect sends nothing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


def _require(module: str, package: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingKVTierPackage(f"this KV tier needs {package}: pip install -e '.[kvtier]'")


async def _check_redis(backend: RedisBackend, url: str, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(backend.client.ping(), timeout_s)
    except Exception as exc:  # noqa: BLE001 - refused, timed out, or an error reply: not there
        await backend.close()
        raise KVTierUnavailable(
            f"no Redis server answered at {redacted(url)} within {timeout_s:g} s: {exc!r}"
        ) from None


def redacted(url: str) -> str:
    """`url` with any password replaced, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
