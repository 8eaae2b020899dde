"""A Ray cluster of several nodes on one machine, for tests of `--launcher ray` past one host.

Each node is a host of `NetnsHosts` (its own network namespace and address on one bridge)
running `ray start --block` there, with its own short temp dir (Ray's AF_UNIX socket paths
live under it and must stay under 108 bytes: `/tmp/rXXXXXXXX/session_.../sockets/...`), its
own `num_cpus` and custom resources. Ray's health checks are shortened (`HEALTH_ENV`) so the
GCS declares a lost node dead within about `NODE_DEAD_S`. Ports are Ray's defaults: each
node has a network namespace of its own, so nothing else on the machine listens there.

Everything is found and stopped by process id, never by name (`ray stop` kills every Ray of
the machine): a node's processes are those of its namespace (`ip netns pids`). `kill_node`
SIGKILLs them all (a node lost at once), `restore` starts such nodes again; `close` kills every node's, then removes the
namespaces (NetnsHosts) and temp dirs, however the run ended. `on(node, argv)` runs a
program on a node (a driver such as the launcher runs on the head, as on a real cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from netns_client import NamespaceClient
from netns_hosts import NetnsHosts, unavailable_reason

GCS_PORT = 6379
HEALTH_ENV = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
NODE_DEAD_S = 6.0  # (period + timeout) x threshold: when the GCS declares a silent node dead
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB; the tests move nothing through it
START_TIMEOUT_S = 180.0  # a node's `ray start` on a small, shared machine
ALIVE_TIMEOUT_S = 120.0
KILL_TIMEOUT_S = 30.0

# Run on a node: the GCS's view of the nodes, as JSON, once `want` of them are alive (or at
# the deadline, whatever it sees then).
_NODES_SCRIPT = """
import json, sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
want, deadline = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while True:
    nodes = [
        {"ip": n["NodeManagerAddress"], "id": n["NodeID"], "alive": n["Alive"],
         "resources": {k: v for k, v in n["Resources"].items() if not k.startswith("node:")}}
        for n in ray.nodes()
    ]
    if sum(n["alive"] for n in nodes) == want or time.monotonic() > deadline:
        break
    time.sleep(0.2)  # polling the GCS's table, bounded by the deadline
print(json.dumps(nodes))
"""


def ray_unavailable_reason() -> str | None:
    reason = unavailable_reason()
    if reason is None and shutil.which("ray", path=os.path.dirname(sys.executable)) is None:
        reason = "needs the ray package (pip install -e '.[ray]')"
    return reason


@dataclass(frozen=True)
class NodeSpec:
    num_cpus: int
    resources: dict[str, float] = field(default_factory=dict)


class RayNodes:
    """`RayNodes({"head": NodeSpec(0), "w1": NodeSpec(1, {...})})`: the first node is the head."""

    def __init__(self, specs: dict[str, NodeSpec]) -> None:
        self.specs = specs
        self.head = next(iter(specs))
        self.hosts = NetnsHosts(list(specs))
        self.temp_dirs: dict[str, str] = {}  # node -> the temp dir of its current Ray
        self._all_temp_dirs: list[str] = []
        self.starters: dict[str, subprocess.Popen] = {}  # node -> its `ray start --block`
        self.started_s = 0.0  # how long the cluster took to come up
        self.token = os.urandom(32).hex()
        self.head_client: NamespaceClient | None = None  # calls made from the head, once started

    @property
    def address(self) -> str:
        return f"{self.hosts.address[self.head]}:{GCS_PORT}"

    def ip(self, node: str) -> str:
        return self.hosts.address[node]

    def node_named(self, ip: str) -> str:
        return next(name for name, address in self.hosts.address.items() if address == ip)

    def __enter__(self) -> "RayNodes":
        self.hosts.__enter__()
        try:
            started = time.monotonic()
            for node in self.specs:
                self.start_node(node)
            self.wait_alive(len(self.specs))
            self.started_s = time.monotonic() - started
            self.head_client = NamespaceClient(self.hosts.namespace[self.head])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def env(self) -> dict[str, str]:
        """The environment of every process on the nodes: the health checks, and Ray's token
        authentication with this cluster's own token (Ray turns it on by itself for a head
        when a token is in ~/.ray, and a worker or driver must then present the same)."""
        return {
            **os.environ, **HEALTH_ENV, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
        }  # fmt: skip

    def start_node(self, node: str) -> None:
        """Start (or start again, after `kill_node`) `node`'s Ray, up to `ray start`'s own
        word that it runs."""
        spec = self.specs[node]
        temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")
        self.temp_dirs[node] = temp_dir
        self._all_temp_dirs.append(temp_dir)
        where = (
            ["--head", "--port", str(GCS_PORT), "--include-dashboard", "false"]
            if node == self.head
            else ["--address", self.address]
        )
        argv = [
            os.path.join(os.path.dirname(sys.executable), "ray"), "start", *where,
            "--node-ip-address", self.ip(node), "--temp-dir", temp_dir, "--num-cpus", str(spec.num_cpus),
            "--resources", json.dumps(spec.resources), "--object-store-memory", str(OBJECT_STORE_BYTES),
            "--disable-usage-stats", "--block",
        ]  # fmt: skip
        process = self.hosts.spawn(
            node, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env()
        )
        self.starters[node] = process
        _wait_output(process, "Ray runtime started", START_TIMEOUT_S, f"ray start on {node}")

    def restore(self) -> None:
        """Start again every node `kill_node` took down, and wait until all are alive."""
        lost = [node for node, starter in self.starters.items() if starter.poll() is not None]
        for node in lost:
            self.start_node(node)
        if lost:
            self.wait_alive(len(self.specs))

    def on(self, node: str, argv: list[str], **options) -> subprocess.Popen:
        """Start `argv` on `node` (killed by its id at `close` if it still runs)."""
        return self.hosts.spawn(node, argv, **{"env": self.env(), **options})

    def nodes(self, want_alive: int, timeout: float = ALIVE_TIMEOUT_S) -> list[dict]:
        """The GCS's nodes (ip, id, alive, resources) once `want_alive` are alive, or at `timeout`."""
        done = subprocess.run(
            [*self.hosts.exec_in(self.head), sys.executable, "-c", _NODES_SCRIPT, self.address, str(want_alive),
             str(timeout)],
            capture_output=True, text=True, timeout=timeout + START_TIMEOUT_S, env=self.env(),
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"could not read Ray's nodes: {done.stderr.strip().splitlines()[-1:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def wait_alive(self, count: int, timeout: float = ALIVE_TIMEOUT_S) -> list[dict]:
        nodes = self.nodes(count, timeout)
        alive = [n for n in nodes if n["alive"]]
        if len(alive) != count:
            raise RuntimeError(f"{len(alive)} Ray nodes alive after {timeout:.0f} s, not {count}: {nodes}")
        return nodes

    def cmdlines(self, node: str) -> dict[int, str]:
        lines = {}
        for pid in self.hosts.pids(node):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    lines[pid] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except (FileNotFoundError, ProcessLookupError):
                pass
        return lines

    def rss_mib(self) -> float:
        """Resident memory of every process on every node."""
        total_kib = 0
        for node in self.specs:
            for pid in self.hosts.pids(node):
                try:
                    with open(f"/proc/{pid}/status") as status:
                        total_kib += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
                except (FileNotFoundError, ProcessLookupError, StopIteration):
                    pass
        return total_kib / 1024

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL every process on `node` (its raylet, its workers, what they started), by id,
        until none is left (one may start while the others die); returns the ids killed."""
        killed: set[int] = set()
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while pids := self.hosts.pids(node):
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of {node} still running after {KILL_TIMEOUT_S:.0f} s: {pids}")
            killed.update(self.hosts.kill_host(node))
        return sorted(killed)

    def close(self) -> None:
        if self.head_client is not None:
            self.head_client.close()
        try:
            for node in self.specs:
                if node in self.hosts.namespace:
                    try:
                        self.kill_node(node)
                    except RuntimeError:
                        pass  # NetnsHosts.close kills what it started; the namespace goes anyway
        finally:
            self.hosts.close()
            for temp_dir in self._all_temp_dirs:
                shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_output(process: subprocess.Popen, text: str, timeout: float, what: str) -> None:
    """Read `process`'s output until a line has `text` (then keep draining it in a thread, so
    it never blocks on a full pipe); RuntimeError quoting its output otherwise."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in process.stdout:
            if len(seen) < 200:
                seen.append(line.rstrip())
            if text in line:
                found.set()
        found.set()  # it exited

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(timeout) or not any(text in line for line in seen):
        how = f"exited ({process.poll()})" if process.poll() is not None else f"not within {timeout:.0f} s"
        raise RuntimeError(f"{what}: no {text!r}, {how}: {seen[-10:]}")
