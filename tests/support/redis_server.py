"""A real Redis (Debian's `/usr/bin/redis-server`) for the KV tier tests: on a free port of
127.0.0.1, its own directory, no persistence, an LRU bound on memory; killed and started again
on the same port, every wait bounded."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

from child_stop import stop_child
from etcd_server import free_port

REDIS = "/usr/bin/redis-server"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


class RedisServer:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="minipd-redis-")
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                REDIS,
                *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir),
                *("--save", "", "--appendonly", "no"),
                *("--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._pong():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port} (exit {self.process.poll()})")
            time.sleep(0.05)  # polling a child's port, bounded by the deadline

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self.process is not None:
            stop_child(self.process, STOP_TIMEOUT_S)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
