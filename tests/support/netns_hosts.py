"""Hosts made of network namespaces on one bridge, for tests that need several machines.

    namespace S (the switch): bridge br0
      veth s-HOST <-> eth0 in namespace HOST, address 10.77.0.N/24, one per host

The bridge lives in a namespace of its own and no namespace has a route out, so the hosts'
segment is isolated from the machine's (its addresses cannot collide with the machine's,
and nothing leaves it). Processes run in a host with `exec_in(host)`; `partition(host)`
takes its link down (its processes live on, cut off) and `heal(host)` brings it up again;
`kill_host(host)` kills every process in its namespace by its id (a host losing power).
Names carry the creating pid (`mpdhost-PID-N-...`); namespaces left by a dead run are
removed on the next start, with the processes still in them. `close` (and leaving the `with`
block, however it ends) kills the processes started through `spawn`, and any other process
still in one of its namespaces, by their ids, then deletes every namespace, which deletes the
bridge and the veths. Needs root and `ip`.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

NS_PREFIX = "mpdhost"
NS_PATTERN = re.compile(rf"^{NS_PREFIX}-(\d+)-\d+-")
SUBNET = "10.77.0"
COMMAND_TIMEOUT_S = 30.0
KILL_TIMEOUT_S = 15.0
_counter = itertools.count()


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    return None if shutil.which("ip") else "needs ip (iproute2)"


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def remove_stale() -> None:
    """Delete the namespaces of runs that died, killing (by id) what still runs in them first:
    a namespace lives on, unnamed, while any process is in it."""
    for name in namespaces():
        match = NS_PATTERN.match(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            for pid in _run("ip", "netns", "pids", name, check=False).split():
                _kill(int(pid))
            _run("ip", "netns", "del", name, check=False)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it exited meanwhile
        pass


class NetnsHosts:
    def __init__(self, hosts: list[str]):
        tag = f"{NS_PREFIX}-{os.getpid()}-{next(_counter)}"
        self.switch = f"{tag}-switch"
        self.namespace = {host: f"{tag}-{host}" for host in hosts}
        self.address = {host: f"{SUBNET}.{i + 1}" for i, host in enumerate(hosts)}
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> "NetnsHosts":
        remove_stale()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, (host, ns) in enumerate(self.namespace.items()):
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            port = f"s{i}"
            _run("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address[host]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")

    def exec_in(self, host: str) -> list[str]:
        """The command prefix that runs a program on `host`."""
        return ["ip", "netns", "exec", self.namespace[host]]

    def spawn(self, host: str, argv: list[str], **options) -> subprocess.Popen:
        """Start `argv` on `host`; `close` kills it by its id if it still runs."""
        process = subprocess.Popen([*self.exec_in(host), *argv], **options)
        self.processes.append(process)
        return process

    def partition(self, host: str) -> None:
        _run("ip", "-n", self.namespace[host], "link", "set", "eth0", "down")

    def heal(self, host: str) -> None:
        _run("ip", "-n", self.namespace[host], "link", "set", "eth0", "up")

    def pids(self, host: str) -> list[int]:
        """The ids of every process running on `host` (in its namespace)."""
        return [int(pid) for pid in _run("ip", "netns", "pids", self.namespace[host]).split()]

    def kill_host(self, host: str) -> list[int]:
        """SIGKILL every process of `host`, as if it lost power; returns their ids. Its link
        stays up: the kernel closes their connections."""
        killed = self.pids(host)
        for pid in killed:
            _kill(pid)
        for process in self.processes:  # reap the ones started here (the rest are others' children)
            if process.pid in killed:
                process.wait(KILL_TIMEOUT_S)
        return killed

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)  # `ip netns exec` execs the program: this is its pid
                process.wait(KILL_TIMEOUT_S)
        present = set(namespaces())
        for ns in [*self.namespace.values(), self.switch]:  # anything started there another way
            if ns in present:
                for pid in _run("ip", "netns", "pids", ns, check=False).split():
                    _kill(int(pid))
        for ns in [*self.namespace.values(), self.switch]:
            if ns in present:
                _run("ip", "netns", "del", ns, check=False)
