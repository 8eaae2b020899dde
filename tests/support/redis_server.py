"""A real Redis (Debian's `/usr/bin/redis-server`) for the KV tier tests: on a free port of
127.0.0.1 (or of `host`, started through `spawn`: on a host of its own, store_host.py), its own
directory, no persistence, an LRU bound on memory; killed and started again on the same port,
every wait bounded. `dbsize()` counts its keys (the blocks stored). `running_redis(...)`: one
started for a `with` body (a fixture's `yield`), closed after it however it ended."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Callable, Iterator

from child_stop import stop_child
from etcd_server import free_port

REDIS = "/usr/bin/redis-server"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


class RedisServer:
    def __init__(self, host: str = "127.0.0.1", spawn: Callable[..., subprocess.Popen] = subprocess.Popen) -> None:
        self.dir = tempfile.mkdtemp(prefix="minipd-redis-")
        self.host, self.spawn = host, spawn
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        self.process = self.spawn(
            [
                REDIS,
                *("--port", str(self.port), "--bind", self.host, "--dir", self.dir),
                *("--save", "", "--appendonly", "no"),
                *("--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru"),
                *(() if self.host == "127.0.0.1" else ("--protected-mode", "no")),  # reached from another host
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
            return self._ask(b"PING", timeout_s=1.0).startswith(b"+PONG")
        except OSError:
            return False

    def _ask(self, command: bytes, timeout_s: float) -> bytes:
        with socket.create_connection((self.host, self.port), timeout=timeout_s) as s:
            s.sendall(command + b"\r\n")
            return s.recv(64)

    def dbsize(self, timeout_s: float = 10.0) -> int:
        """How many keys the server holds (an integer reply, `:N`)."""
        reply = self._ask(b"DBSIZE", timeout_s)
        assert reply.startswith(b":"), reply
        return int(reply[1:].strip())

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


@contextlib.contextmanager
def running_redis(**options) -> Iterator[RedisServer]:
    server = RedisServer(**options)
    try:
        server.start()
        yield server
    finally:
        server.close()
