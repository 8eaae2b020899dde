"""A real etcd (Debian's `/usr/bin/etcd`) for the registry tests: on free ports of
127.0.0.1, with its own data dir, stopped by its pid and started again on the same port and
data dir (an etcd restart), every wait bounded. On a host of `NetnsHosts`, give its address,
ports and `prefix` (`hosts.exec_in(host)`): etcd and etcdctl then run in that namespace.
With `tls` (etcd_certs.py) it serves TLS only and requires client certificates; once
`enable_auth` ran, etcdctl logs in as root."""

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
from etcd_certs import EtcdCerts

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
        self,
        host: str = "127.0.0.1",
        ports: tuple[int, int] | None = None,
        prefix: Sequence[str] = (),
        tls: EtcdCerts | None = None,
    ) -> None:
        """`ports`: client and peer ports (default: free ones of 127.0.0.1)."""
        self.data_dir = tempfile.mkdtemp(prefix="minipd-etcd-")
        self.host, self.prefix, self.tls = host, list(prefix), tls
        self.port, self.peer_port = ports or (free_port(), free_port())
        self.process: subprocess.Popen | None = None
        self.login: str | None = None  # USER:PASSWORD etcdctl logs in with (set by enable_auth)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoint}{prefix}"

    def _client_tls(self) -> list[str]:
        """etcdctl's TLS flags."""
        tls = self.tls
        return [] if tls is None else [f"--cacert={tls.ca}", f"--cert={tls.client_cert}", f"--key={tls.client_key}"]

    def start(self) -> None:
        scheme = "http" if self.tls is None else "https"
        client, peer = f"{scheme}://{self.host}:{self.port}", f"http://{self.host}:{self.peer_port}"
        tls = self.tls
        server_tls = [] if tls is None else [
            f"--cert-file={tls.server_cert}", f"--key-file={tls.server_key}", f"--trusted-ca-file={tls.ca}",
            "--client-cert-auth",
        ]  # fmt: skip
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
                *server_tls,
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
        login = [] if self.login is None else [f"--user={self.login}"]
        return subprocess.run(
            [
                *self.prefix,
                ETCDCTL,
                f"--endpoints={self.endpoint}",
                "--dial-timeout=2s",
                "--command-timeout=5s",
                *self._client_tls(),
                *login,
                *args,
            ],  # fmt: skip
            env={**os.environ, "ETCDCTL_API": "3"},
            capture_output=True,
            check=check,
            input=stdin,
            timeout=20,
        )

    def enable_auth(self, user: str, password: str, prefix: str) -> None:
        """Turn etcd's authentication on: root (etcdctl logs in as it from here on) and `user`,
        who may read and write `prefix` only."""
        root_password = "root-" + password
        for args in (
            ("user", "add", "root", f"--new-user-password={root_password}"),
            ("user", "grant-role", "root", "root"),
            ("role", "add", user),
            ("role", "grant-permission", user, "--prefix=true", "readwrite", prefix),
            ("user", "add", user, f"--new-user-password={password}"),
            ("user", "grant-role", user, user),
            ("auth", "enable"),
        ):
            self.ctl(*args)
        self.login = f"root:{root_password}"

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
                *self._client_tls(),
                *([] if self.login is None else [f"--user={self.login}"]),
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
