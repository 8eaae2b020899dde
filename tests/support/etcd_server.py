"""A real etcd (Debian's `/usr/bin/etcd`) for the registry tests: on free ports of
127.0.0.1, with its own data dir, stopped by its pid and started again on the same port and
data dir (an etcd restart), every wait bounded. On a host of `NetnsHosts`, give its address,
ports and `prefix` (`hosts.exec_in(host)`): etcd and etcdctl then run in that namespace."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Sequence

import pytest

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0

needs_etcd = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd is not installed (.ci/run installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    def __init__(
        self, host: str = "127.0.0.1", ports: tuple[int, int] | None = None, prefix: Sequence[str] = ()
    ) -> None:
        """`ports`: client and peer ports (default: free ones of 127.0.0.1)."""
        self.data_dir = tempfile.mkdtemp(prefix="minipd-etcd-")
        self.host, self.prefix = host, list(prefix)
        self.port, self.peer_port = ports or (free_port(), free_port())
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoint}{prefix}"

    def start(self) -> None:
        client, peer = f"http://{self.host}:{self.port}", f"http://{self.host}:{self.peer_port}"
        self.process = subprocess.Popen(
            [
                *self.prefix,
                ETCD,
                "--name=minipd-test",
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=minipd-test={peer}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.ctl("endpoint", "health", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start on {self.endpoint} (exit {self.process.poll()})")
            time.sleep(0.1)  # polling its health: it answers within a second or two

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)
        self.process = None

    def ctl(self, *args: str, check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.prefix, ETCDCTL, f"--endpoints={self.endpoint}", "--dial-timeout=2s", "--command-timeout=5s", *args],
            env={**os.environ, "ETCDCTL_API": "3"},
            capture_output=True,
            check=check,
            input=stdin,
            timeout=20,
        )

    def revision(self) -> int:
        """etcd's current revision."""
        return json.loads(self.ctl("get", "/", "--write-out=json").stdout)["header"]["revision"]

    def watch(self, prefix: str, start_revision: int) -> subprocess.Popen:
        """`etcdctl watch` of `prefix` from `start_revision` on (so no event after it is missed
        however late the watch is set up), its events on stdout, one line each (PUT, key, value)."""
        return subprocess.Popen(
            [
                *self.prefix,
                ETCDCTL,
                f"--endpoints={self.endpoint}",
                "watch",
                "--prefix",
                f"--rev={start_revision}",
                prefix,
            ],
            env={**os.environ, "ETCDCTL_API": "3"},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def keys(self, prefix: str) -> list[str]:
        out = self.ctl("get", "--prefix", "--keys-only", prefix).stdout.decode()
        return [line for line in out.splitlines() if line]

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


@pytest.fixture(scope="module", name="etcd")
def etcd_fixture():
    """One etcd for the test module that imports this fixture, removed with its data after it."""
    server = EtcdServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll `predicate` until it returns something truthy (returned); AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(interval)  # polling an outside process's state, bounded by the deadline
