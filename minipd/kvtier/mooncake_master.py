"""A local Mooncake master as a child process, for a cluster that brings its own store
(`minipd --role cluster --kv-tier mooncake`: entrypoints/tier_master.py) and for the tests.

It listens on three consecutive free ports: RPC on `port`, its HTTP metadata server (which the
clients need, served by the master itself) on `port + 1`, metrics on `port + 2`; so its URL,
`mooncake://HOST:PORT`, is all a client needs (`open_tier` derives the metadata URL the same
way). Its metadata listener ignores the host flag and listens on every address. Every wait is
bounded: the start until both ports answer, the stop until SIGTERM takes (it can take long to
exit), then SIGKILL.
"""

from __future__ import annotations

import importlib.util
import signal
import socket
import subprocess
import time
from pathlib import Path

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PORT_TRIES = 50
# The lease a lookup or get puts on a key, holding off its eviction. The master's default (10 s)
# would let a hot prefix's lookups pin it for long; a fetch is done well within 2 s.
LEASE_TTL_MS = 2000


class MasterFailed(RuntimeError):
    pass


def master_binary() -> Path:
    """The `mooncake_master` binary the Mooncake package ships (the `kvtier` extra)."""
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("mooncake is not installed: pip install -e '.[kvtier]'")
    return Path(next(iter(spec.submodule_search_locations))) / "mooncake_master"


def free_port_run(host: str, count: int) -> int:
    """A port P with P .. P+count-1 all free on `host` now (a later bind may still lose a race)."""
    for _ in range(PORT_TRIES):
        with socket.socket() as probe:
            probe.bind((host, 0))
            first = probe.getsockname()[1]
        if first + count <= 65536 and all(_free(host, first + i) for i in range(1, count)):
            return first
    raise MasterFailed(f"no run of {count} free ports on {host} in {PORT_TRIES} tries")


def _free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


class MooncakeMaster:
    def __init__(self, host: str = "127.0.0.1", port: int | None = None, log_path: str | None = None) -> None:
        """`port`: the RPC port (default: the first of three free ones, chosen at the first
        start and kept, so a restart comes back at the same URL)."""
        self.host, self.port, self.log_path = host, port, log_path
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mooncake://{self.host}:{self.port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.host}:{self.port + 1}/metadata"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start it and wait until its RPC and metadata ports answer; MasterFailed if it exits
        or they do not answer within `timeout_s` (the child is stopped then)."""
        if self.process is not None and self.process.poll() is None:
            raise MasterFailed(f"mooncake_master already runs on {self.host}:{self.port}")
        if self.port is None:
            self.port = free_port_run(self.host, 3)
        port = self.port
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                [
                    str(master_binary()),
                    f"--rpc_address={self.host}",
                    f"--rpc_port={port}",
                    "--enable_http_metadata_server=true",
                    f"--http_metadata_server_host={self.host}",
                    f"--http_metadata_server_port={port + 1}",
                    f"--metrics_host={self.host}",
                    f"--metrics_port={port + 2}",
                    f"--default_kv_lease_ttl={LEASE_TTL_MS}",
                    "--enable_metric_reporting=false",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # the child has its own descriptor
        deadline = time.monotonic() + timeout_s
        while not (self._answers(port) and self._answers(port + 1)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                code = self.process.poll()
                self.stop()
                raise MasterFailed(f"mooncake_master did not start on {self.host}:{port} (exit {code})")
            time.sleep(0.05)  # polling a child's ports, bounded by the deadline

    def _answers(self, port: int) -> bool:
        try:
            socket.create_connection((self.host, port), timeout=1.0).close()
        except OSError:
            return False
        return True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a crash would (tests); `start()` brings it back on the same ports."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(STOP_TIMEOUT_S)

    def __enter__(self) -> MooncakeMaster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
