"""What the role runners need from a registry, with no registry library imported; they import
this module only with `--registry` (a process without it loads no registry module but the
flag's URL parser, etcd_url.py: tests/processes/test_core_imports.py).

- the router depends on `router.switch_claims.SwitchClaims` only (the embedded default grants
  every claim; the etcd one, epoch_cas.py, one router only);
- `router_membership(router, url, ttl_s)` / `instance_presence(instance, ...)`: the etcd side
  of a router (watch the prefix, connect to what appears) and of an instance (publish itself
  under a lease), imported only with `--registry`; the embedded default is none of them
  (instances register over the router's control port, entrypoints/registration.py).
- `controller_election(controller, url, ttl_s, name)`: the ratio controller run by one of
  several routers at a time (election.py);
- `require_etcd_client()`: ValueError naming the flag and the extra when the client library
  is missing, checked at start-up before anything loads.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from minipd.disagg.instance import Instance
    from minipd.ops.control_loop.controller_switch import ControllerSwitch
    from minipd.ops.registry.etcd_url import RegistryUrl
    from minipd.router.router import Router

ETCD_EXTRA = "etcd"


class Lifecycle(Protocol):
    async def start(self, timeout: float) -> None: ...

    async def close(self) -> None: ...


def require_etcd_client() -> None:
    if importlib.util.find_spec("aetcd") is None:
        raise ValueError(
            f"registry: --registry etcd://... needs the etcd client, which is not installed: "
            f"pip install 'minipd[{ETCD_EXTRA}]'"
        )


def router_membership(router: "Router", url: "RegistryUrl", ttl_s: int) -> Lifecycle:
    from minipd.ops.registry.router_membership import EtcdRouterMembership

    return EtcdRouterMembership(router, url, ttl_s)


def instance_presence(instance: "Instance", url: "RegistryUrl", host: str, port: int, ttl_s: int) -> Lifecycle:
    from minipd.ops.registry.publisher import InstancePublisher

    return InstancePublisher(instance, url, host, port, ttl_s)


def controller_election(controller: "ControllerSwitch", url: "RegistryUrl", ttl_s: int, name: str):
    """A `ControllerElection` that starts `controller` while this router is elected and stops
    it when deposed; `controller.election` is set to it (its state shows the leadership)."""
    from minipd.ops.registry.election import ControllerElection
    from minipd.ops.registry.etcd_client import EtcdEndpoints

    election = ControllerElection(EtcdEndpoints(url), url.prefix, ttl_s, name, controller.start, controller.stop)
    controller.election = election
    return election
