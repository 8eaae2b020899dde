"""One `minipd` process started by hand in a test (an instance joining, another router):
its stdout read on a thread, started once its `READY` line arrived (bounded), stopped by its
pid (SIGCONT first, in case a test froze it). `prefix` runs it through a command such as
`ip netns exec NS` (which execs it: the pid is still minipd's); `wait=False` returns at once,
and `wait_ready` waits for the READY line later (to start several at once)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

from minipd.entrypoints.flag_spec import CLUSTER_SECRET_ENV

READY_TIMEOUT_S = 120.0


class Process:
    def __init__(
        self,
        argv: list[str],
        secret: str,
        prefix: Sequence[str] = (),
        wait: bool = True,
        log: str | None = None,
        env: dict[str, str] | None = None,
    ):
        """`log`: a file its stderr is appended to (discarded without one); `env`: variables
        set for it beside this process's own."""
        self.argv = argv
        with open(log or os.devnull, "a") as stderr:
            self.popen = subprocess.Popen(
                [*prefix, sys.executable, "-m", "minipd", *argv],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**os.environ, **(env or {}), CLUSTER_SECRET_ENV: secret},
            )
        self.started_at = time.monotonic()
        self.ready_at: float | None = None  # when its READY line arrived
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.announcements: list[str] = []
        self.address: tuple[str, int] | None = None  # from `READY <role> <id> <host>:<port>`
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait (bounded) for the READY line; stops the process and raises if it does not come."""
        deadline = time.monotonic() + timeout
        try:
            while self.address is None:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
                assert line is not None, f"{self.argv} exited with {self.popen.wait()}"
                if line.startswith("READY "):
                    host, _, port = line.rsplit(" ", 1)[1].rpartition(":")
                    self.address = (host, int(port))
                    self.ready_at = time.monotonic()
                else:
                    self.announcements.append(line)
        except BaseException:
            self.stop()
            raise

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.put(line.rstrip())
        self.lines.put(None)

    @property
    def http_url(self) -> str:
        return next(line for line in self.announcements if "serving the OpenAI API" in line).rsplit(" on ", 1)[1]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.terminate()
            try:
                self.popen.wait(60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(30)
