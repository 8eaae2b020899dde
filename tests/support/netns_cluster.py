"""A minipd cluster across hosts made of network namespaces (netns_hosts.py):

    etcd       etcd, its client and peer ports on its own address
    router-a   minipd --role router (control port, HTTP API), --ratio-controller
    router-b   the same: the two elect one controller through etcd
    prefill-a  minipd --role prefill --instance-id prefill-a (control port, tcp KV port)
    prefill-b  ...
    decode-a   minipd --role decode ...
    decode-b   ...
    client     the test process's own connections (netns_client.py)

Every process binds its host's address only (`--host`, `--http-host`), finds the others in
etcd (`--registry`, short leases: `TTL_S`) and moves KV over tcp between the hosts; all
share one cluster secret. The test process talks to the routers from the client host: their
control port (`ClusterClient`) and their HTTP API. A host's processes can be killed
(`kill_host`) and started again (`start`) with the same command line; `close` stops what
runs, and the hosts' own `close` kills anything left by its id.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from disagg_helpers import ENGINE_ARGV
from etcd_server import EtcdServer, wait_until
from minipd_process import Process
from netns_client import NamespaceClient
from netns_hosts import NetnsHosts

from minipd.router.cluster_client import ClusterClient

TTL_S = 2
PREFIX = "/hosts"
INSTANCES = {"prefill-a": "prefill", "prefill-b": "prefill", "decode-a": "decode", "decode-b": "decode"}
ROUTERS = ("router-a", "router-b")
HOSTS = ["etcd", *ROUTERS, *INSTANCES, "client"]
# etcd is alone in its namespace, so its usual ports are free there (nothing else can bind them)
ETCD_PORTS = (2379, 2380)
# objectives no load here misses: the elected controller runs and decides, and never moves anything
CONTROLLER_ARGV = [
    "--ratio-controller",
    "--controller-slo",
    "ttft:600000",
    "itl:600000",
    "--controller-interval-s",
    "0.2",
]
HTTP_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 30.0


class NetnsCluster:
    def __init__(self, hosts: NetnsHosts):
        self.hosts = hosts
        self.secret = secrets.token_hex(32)
        self.log_dir = tempfile.mkdtemp(prefix="minipd-netns-")
        self.etcd = EtcdServer(hosts.address["etcd"], ETCD_PORTS, hosts.exec_in("etcd"))
        self.client = NamespaceClient(hosts.namespace["client"])
        self.processes: dict[str, Process] = {}
        self.clients: dict[str, ClusterClient] = {}

    # ---- processes -----------------------------------------------------------------------
    def argv(self, host: str) -> list[str]:
        address = self.hosts.address[host]
        common = ["--host", address, "--port", "0", "--registry", self.etcd.url(PREFIX), "--registry-ttl-s", str(TTL_S)]
        if host in ROUTERS:
            return ["--role", "router", *common, "--http-host", address, "--http-port", "0", *CONTROLLER_ARGV]
        role = INSTANCES[host]
        return [
            "--role",
            role,
            "--instance-id",
            host,
            *common,
            "--transport",
            "tcp",
            "--torch-threads",
            "1",
            *ENGINE_ARGV,
        ]

    def start(self, host: str, wait: bool = True) -> Process:
        """Start `host`'s minipd process (again); with `wait`, once READY, a router's control
        port connected to from the client host."""
        process = Process(
            self.argv(host), self.secret, self.hosts.exec_in(host), wait=False, log=f"{self.log_dir}/{host}.log"
        )
        self.processes[host] = process
        if wait:
            self.wait_ready(host)
        return process

    def wait_ready(self, host: str) -> None:
        self.processes[host].wait_ready()
        if host in ROUTERS:
            self.connect(host)

    def start_all(self) -> None:
        self.etcd.start()
        for host in [*INSTANCES, *ROUTERS]:  # all at once: each imports torch and loads its model
            self.start(host, wait=False)
        for host in [*INSTANCES, *ROUTERS]:
            self.wait_ready(host)
        for router in ROUTERS:
            wait_until(lambda r=router: set(self.seen(r)) == set(INSTANCES), JOIN_TIMEOUT_S, f"{router} sees all")

    def connect(self, router: str) -> ClusterClient:
        old = self.clients.pop(router, None)
        if old is not None:
            self.client.run(old.close())
        host, port = self.processes[router].address
        self.clients[router] = self.client.run(ClusterClient.connect(host, port, timeout=30, secret=self.secret))
        return self.clients[router]

    def kill_host(self, host: str) -> list[int]:
        """Kill every process of `host`; the ids killed (its minipd process's among them)."""
        killed = self.hosts.kill_host(host)
        assert self.processes[host].popen.pid in killed, (killed, self.processes[host].popen.pid)
        self.processes[host].popen.wait(30)
        return killed

    def running(self, host: str) -> bool:
        return self.processes[host].popen.poll() is None

    def log_tail(self, host: str, lines: int = 30) -> str:
        path = Path(f"{self.log_dir}/{host}.log")
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def close(self) -> None:
        for client in self.clients.values():
            try:
                self.client.run(client.close(), timeout=10)
            except Exception:  # its router may be gone; the connection goes with the loop
                pass
        for process in self.processes.values():
            process.stop()
        self.client.close()
        self.etcd.close()
        shutil.rmtree(self.log_dir, ignore_errors=True)

    # ---- what the routers say (from the client host) -------------------------------------
    def url(self, router: str) -> str:
        return self.processes[router].http_url

    def get(self, router: str, path: str) -> dict:
        def fetch() -> dict:
            with urllib.request.urlopen(f"{self.url(router)}{path}", timeout=HTTP_TIMEOUT_S) as response:
                return json.loads(response.read())

        return self.client.call(fetch, timeout=HTTP_TIMEOUT_S + 5)

    def post(self, router: str, path: str, body: dict, timeout: float = 120.0) -> tuple[int, dict]:
        return self.client.call(post_json, f"{self.url(router)}{path}", body, timeout, timeout=timeout + 5)

    def seen(self, router: str) -> dict[str, tuple[str, int, bool]]:
        """Each live instance the router knows: (role, epoch, switching)."""
        return {
            i["instance"]: (i["role"], i["epoch"], i["switching"])
            for i in self.get(router, "/admin/instances")["instances"]
        }

    def leader(self, router: str) -> bool:
        return self.get(router, "/admin/controller")["leader"]

    def stats(self, router: str, settle: bool = False) -> list:
        return self.client.run(self.clients[router].stats(settle=settle), timeout=40)

    def listeners(self, host: str) -> set[str]:
        """Every TCP listening address:port on `host` (read from /proc/net/tcp in its namespace)."""
        out = subprocess.run(
            [*self.hosts.exec_in(host), "cat", "/proc/net/tcp", "/proc/net/tcp6"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        found = set()
        for line in out.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                address, port = fields[1].split(":")
                found.add(f"{_address(address)}:{int(port, 16)}")
        return found


def _address(hex_address: str) -> str:
    if len(hex_address) == 8:  # IPv4, little-endian
        return ".".join(str(b) for b in reversed(bytes.fromhex(hex_address)))
    return f"[{hex_address}]"


def post_json(url: str, body: dict, timeout: float) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, method="POST", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def since(start: float) -> float:
    return time.monotonic() - start
