"""One `minipd` process started by hand in a test (an instance joining, another router):
its stdout read on a thread, started once its `READY` line arrived (bounded), stopped by its
pid (SIGCONT first, in case a test froze it)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from minipd.entrypoints.flag_spec import CLUSTER_SECRET_ENV

READY_TIMEOUT_S = 120.0


class Process:
    def __init__(self, argv: list[str], secret: str):
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "minipd", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, CLUSTER_SECRET_ENV: secret},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.announcements: list[str] = []
        self.address: tuple[str, int] | None = None  # from `READY <role> <id> <host>:<port>`
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while True:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
                assert line is not None, f"{argv} exited with {self.popen.wait()}"
                if line.startswith("READY "):
                    host, _, port = line.rsplit(" ", 1)[1].rpartition(":")
                    self.address = (host, int(port))
                    break
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
