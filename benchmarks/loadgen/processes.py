"""Child processes that are always stopped: servers the bench starts through the command line.

Each child runs in its own session (process group), so stopping it also stops every process it
started itself (the cluster launcher's router and instances): SIGTERM to the group, then
SIGKILL after a grace period. `Processes` stops all of its children when its `with` block
ends, however it ends (an exception, Ctrl-C, or SIGTERM turned into one by `bench.py`), and
a second interrupt while it stops them is held back until they are all gone.
"""

from __future__ import annotations

import collections
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

from benchmarks.loadgen.signals import interrupts_deferred
from minipd.entrypoints.flags import CLUSTER_SECRET_ENV
from minipd.transports.shared_secret import generate_secret_text

STOP_GRACE_S = 10.0
KILL_WAIT_S = 5.0
READ_CHUNK_BYTES = 4096
LOG_TAIL_CHARS = 3000
KEPT_LINES = 200

T = TypeVar("T")


def minipd_command() -> list[str]:
    """The `minipd` console script of this environment (the stable interface), else `python -m`."""
    script = Path(sys.executable).with_name("minipd")
    if script.is_file():
        return [str(script)]
    found = shutil.which("minipd")
    return [found] if found else [sys.executable, "-m", "minipd"]


class ManagedProcess:
    """One child: stdout is read for announcements, stderr goes to `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.name, self.argv, self.log_path = name, argv, log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                bufsize=0,
                env=env,
            )
        self.lines: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._pending = b""
        self._drainer: threading.Thread | None = None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""

    def wait_for_line(self, parse: Callable[[str], T | None], timeout_s: float) -> T:
        """The first stdout line for which `parse` returns a value; RuntimeError (with the
        child's log) if it exits first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        fd = self.process.stdout.fileno()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"{self.name} did not get ready in {timeout_s:g} s; its log:\n{self.log_tail()}")
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, READ_CHUNK_BYTES)
            if not chunk:
                status = self.process.wait(KILL_WAIT_S)
                raise RuntimeError(f"{self.name} exited with status {status}; its log:\n{self.log_tail()}")
            self._pending += chunk
            *complete, self._pending = self._pending.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                value = parse(line)
                if value is not None:
                    return value

    def drain(self) -> None:
        """Keep reading stdout in the background, so a chatty child never blocks on a full pipe."""

        def run() -> None:
            stream = self.process.stdout
            while chunk := stream.read(READ_CHUNK_BYTES):
                self.lines.extend(chunk.decode(errors="replace").splitlines())

        self._drainer = threading.Thread(target=run, name=f"drain-{self.name}", daemon=True)
        self._drainer.start()

    def stop(self) -> int | None:
        """SIGTERM the child's group, SIGKILL it after the grace period; returns the exit status."""
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(KILL_WAIT_S)
        self._signal_group(signal.SIGKILL)  # anything of the group still running (a launcher's children)
        if self._drainer is not None:
            self._drainer.join(KILL_WAIT_S)
        self.process.stdout.close()
        return self.process.returncode

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)  # its own session: the group id is its pid
        except (ProcessLookupError, PermissionError):
            pass


class Processes:
    """Children started inside a `with` block, all stopped (newest first) when it ends.

    Logs go to a fresh directory, removed afterwards unless the block failed (its path is
    then printed, so the children's errors can be read).

    Every child gets the same fresh cluster secret in its environment (`secret`), so that the
    benchmark can reach a cluster's control plane too (`ClusterClient.connect(..., secret=)`)."""

    def __init__(self, label: str = "minipd-bench"):
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"{label}-"))
        self.children: list[ManagedProcess] = []
        self.secret = generate_secret_text()

    def start(self, name: str, argv: list[str]) -> ManagedProcess:
        env = {**os.environ, CLUSTER_SECRET_ENV: self.secret}
        child = ManagedProcess(name, argv, self.log_dir / f"{name}.log", env)
        self.children.append(child)
        return child

    def stop_all(self) -> None:
        """Every child, newest first; a Ctrl-C or SIGTERM meanwhile waits until all are stopped."""
        with interrupts_deferred():
            while self.children:
                self.children.pop().stop()

    def __enter__(self) -> "Processes":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop_all()
        if exc_type is None:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        else:
            print(f"minipd-bench: server logs kept in {self.log_dir}", file=sys.stderr)
