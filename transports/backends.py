"""Transport names -> backends, imported only when chosen so that a missing optional package
matters only to the backend that needs it. Each backend's spec names the instance settings it
takes beyond the common ones (`backend_options` picks them), so no caller tests the name."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Mapping, NamedTuple

import torch

from minipd.transports.base import Transport


class BackendSpec(NamedTuple):
    module: str  # under minipd.transports
    class_name: str
    extra: str | None  # the pip extra that installs its optional packages
    packages: tuple[str, ...]  # top-level modules the backend imports
    options: tuple[str, ...] = ()  # the instance settings it takes beyond COMMON_OPTIONS


# what every backend takes (see Transport): its egress cap and how long a send may stall
COMMON_OPTIONS = ("link_gbps", "stall_timeout_s")


BACKENDS: dict[str, BackendSpec] = {
    "loopback": BackendSpec("loopback", "LoopbackTransport", None, ()),
    "tcp": BackendSpec("tcp", "TcpTransport", None, (), options=("host", "max_connections")),  # its own KV port
    "ucx": BackendSpec("ucx", "UcxTransport", "ucx", ("ucxx",)),
    "nixl": BackendSpec("nixl", "NixlTransport", "nixl", ("nixl_cu12",)),
}


class MissingBackendError(ImportError):
    """The chosen backend's optional package is not installed."""


def backend_class(name: str) -> type[Transport]:
    """Import and return the backend class called `name`; raises ValueError for an unknown name
    and MissingBackendError (saying which extra to install) for a missing package."""
    spec = backend_spec(name)
    try:
        module = importlib.import_module(f"minipd.transports.{spec.module}")
    except ModuleNotFoundError as exc:
        if spec.extra is not None and exc.name in spec.packages:
            raise MissingBackendError(
                f"transport {name!r} needs the {spec.extra} extra: pip install -e '.[{spec.extra}]' "
                f"(missing module {exc.name!r})"
            ) from exc
        raise
    return getattr(module, spec.class_name)


def backend_options(name: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The options backend `name` is built with, out of an instance's `settings`: the common
    ones and those its spec names; a setting that is None is left to the backend's default."""
    wanted = (*COMMON_OPTIONS, *backend_spec(name).options)
    return {key: value for key, value in settings.items() if key in wanted and value is not None}


def backend_spec(name: str) -> BackendSpec:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown transport {name!r}; known transports: {sorted(BACKENDS)}") from None


def create_transport(name: str, pool: torch.Tensor, *, instance_id: str, **options) -> Transport:
    """Build the `name` backend over `pool` (call `await start()` on it next). Options common to
    all: `link_gbps` (egress limit), `stall_timeout_s`, `secret` (the cluster's SharedSecret);
    backend-specific ones are documented on
    each class."""
    return backend_class(name)(pool, instance_id=instance_id, **options)


def available_transports() -> list[str]:
    """Names of the backends whose packages are installed here."""
    names = []
    for name, spec in BACKENDS.items():
        if all(importlib.util.find_spec(package) is not None for package in spec.packages):
            names.append(name)
    return names
