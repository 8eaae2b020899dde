"""`minipd` processes whose membership lives in a real etcd, started one by one (instances and
routers with `--registry`), and what the registry tests read and write there with etcdctl
(records with their leases, leases of the test's own) and ask each router (does it serve,
which instances it uses). Every wait is bounded; stopped by pid at the end."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import time

from disagg_helpers import ENGINE_ARGV
from etcd_server import EtcdServer
from http_helpers import http_json
from minipd_process import Process

TTL_S = 2


class RegistryCluster:
    def __init__(self, etcd: EtcdServer, prefix: str, log_dir: str, registry_argv=(), env=None, url: str | None = None):
        """`registry_argv`: flags every process gets beside `--registry` (TLS files); `env`:
        variables each gets (the etcd password); `url`: the registry URL (default: etcd's, at `prefix`)."""
        self.etcd, self.prefix, self.log_dir = etcd, prefix, log_dir
        self.url = url or etcd.url(prefix)
        self.registry_argv, self.env = list(registry_argv), env
        self.secret = secrets.token_hex(16)
        self.processes: dict[str, Process] = {}

    def _start(self, name: str, argv: list[str]) -> Process:
        registry = ["--registry", self.url, "--registry-ttl-s", str(TTL_S), *self.registry_argv]
        process = Process([*argv, *registry, "--liveness-timeout-s", "120"], self.secret, log=self.log_path(name),
                          env=self.env)  # fmt: skip
        self.processes[name] = process
        return process

    def log_path(self, name: str) -> str:
        return os.path.join(self.log_dir, f"{name}.log")

    def log(self, name: str) -> str:
        """What the process `name` wrote to its stderr so far."""
        with open(self.log_path(name)) as f:
            return f.read()

    def start_instance(self, name: str, role: str = "decode") -> Process:
        argv = ["--role", role, "--instance-id", name, "--port", "0", "--transport", "tcp", "--torch-threads", "1"]
        return self._start(name, [*argv, *ENGINE_ARGV])

    def start_router(self, name: str) -> Process:
        return self._start(name, ["--role", "router", "--port", "0", "--http-port", "0"])

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()

    # ---- the routers, as their clients see them ------------------------------------------------
    @staticmethod
    def router_name(router: Process) -> str:
        """The name a router goes by in the registry."""
        return f"router-{socket.gethostname()}-{router.popen.pid}"

    @staticmethod
    def serves(router: Process) -> bool:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        return http_json("POST", f"{router.http_url}/v1/completions", body).status == 200

    @staticmethod
    def instances(router: Process) -> dict[str, dict]:
        """The live instances the router uses, by id (`switching`: it sends them no new work)."""
        return {i["instance"]: i for i in http_json("GET", f"{router.http_url}/admin/instances").body["instances"]}

    # ---- etcd, as etcdctl sees it ----------------------------------------------------------------
    def key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))

    def get(self, key: str) -> tuple[dict, int] | None:
        """The JSON value at `key` and the lease it is under (0: none), or None."""
        kvs = json.loads(self.etcd.ctl("get", key, "--write-out=json").stdout).get("kvs", [])
        if not kvs:
            return None
        return json.loads(base64.b64decode(kvs[0]["value"])), int(kvs[0].get("lease", 0))

    def put(self, key: str, value: dict, lease: int = 0) -> None:
        """Write `value` as JSON at `key`, under `lease` (0: none), as anyone with etcdctl could."""
        self.etcd.ctl("put", *([f"--lease={lease:x}"] if lease else []), key, "--", json.dumps(value))

    def grant_lease(self, ttl_s: int) -> int:
        """A lease of the test's own (kept alive by nobody: it lasts `ttl_s`)."""
        return int(json.loads(self.etcd.ctl("lease", "grant", str(ttl_s), "--write-out=json").stdout)["ID"])

    def revoke(self, lease: int) -> None:
        self.etcd.ctl("lease", "revoke", f"{lease:x}")


def timed(condition, bound_s: float, what: str) -> float:
    """Seconds until `condition()` held, polled; AssertionError when it does not within `bound_s`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > bound_s:
            raise AssertionError(f"not within {bound_s} s: {what}")
        time.sleep(0.05)  # polling outside processes' state, bounded by the deadline
    return time.monotonic() - start
