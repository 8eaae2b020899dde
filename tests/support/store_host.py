"""A store on a host of its own that this namespace reaches, its link slowed on demand with
`tc ... netem delay`, for the KV tier's slow-store tests.

netns_hosts.py's one host `store` on its bridge (10.77.0.1), and one more veth from the root
namespace (the cluster's) into that bridge, its root end 10.77.0.254/24:

    root namespace: ROOT_END 10.77.0.254 <-> bridge br0 (switch namespace) <-> eth0 10.77.0.1 (store)

The segment is netns_hosts.py's fixed one, so two StoreHosts must not live at once on a
machine (the tests using one are named `test_netns_*`: conftest.py runs those one at a time).
`delay(ms)` puts netem on the store's eth0 (every packet it sends waits `ms`); `undelay()`
takes it off. `close()` (and leaving the `with` block, however it ends) is netns_hosts.py's:
the processes killed by their ids, every namespace deleted with its veths; the root end goes
with its peer (and is deleted here too, for a start that failed half-way). Needs root, `ip`
and `tc`; `netem_missing()` says why netem cannot be used here (a kernel without sch_netem).
"""

from __future__ import annotations

import os
import subprocess

from netns_hosts import NS_PREFIX, SUBNET, NetnsHosts, unavailable_reason

COMMAND_TIMEOUT_S = 30.0
ROOT_ADDRESS = f"{SUBNET}.254"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def netem_missing() -> str | None:
    """None when a netem qdisc can be added here, else why not (tried on a namespace's own lo)."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    probe = f"{NS_PREFIX}-{os.getpid()}-0-netem-probe"
    _run("ip", "netns", "add", probe)
    try:
        netem = ("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
        done = _run("ip", "netns", "exec", probe, *netem, check=False)
        return None if done.returncode == 0 else f"no netem qdisc in this kernel: {done.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)


class StoreHost(NetnsHosts):
    def __init__(self) -> None:
        super().__init__(["store"])
        self.root_end = f"mps{os.getpid() % 10**7:07d}"  # at most 15 characters

    @property
    def store_address(self) -> str:
        return self.address["store"]

    def _create(self) -> None:
        super()._create()
        _run("ip", "link", "add", self.root_end, "type", "veth", "peer", "name", "sroot", "netns", self.switch)
        _run("ip", "-n", self.switch, "link", "set", "sroot", "master", "br0")
        _run("ip", "-n", self.switch, "link", "set", "sroot", "up")
        _run("ip", "addr", "add", f"{ROOT_ADDRESS}/24", "dev", self.root_end)
        _run("ip", "link", "set", self.root_end, "up")

    def _tc(self, *argv: str) -> str:
        return _run(*self.exec_in("store"), "tc", "qdisc", *argv).stdout

    def delay(self, ms: int) -> None:
        """Every packet the store sends waits `ms` (netem on its end of the link)."""
        self._tc("add", "dev", "eth0", "root", "netem", "delay", f"{ms}ms")

    def undelay(self) -> None:
        self._tc("del", "dev", "eth0", "root")

    def qdiscs(self) -> str:
        return self._tc("show", "dev", "eth0")

    def close(self) -> None:
        super().close()
        _run("ip", "link", "del", self.root_end, check=False)
