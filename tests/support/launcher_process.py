"""`minipd --role cluster` as a user runs it, for the launcher's tests: its output read line
by line on threads (every wait bounded), its children's pids from its ready lines, and
whether a pid is gone."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time

STARTUP_TIMEOUT_S = 120.0  # several processes importing torch at once on a small machine
STOP_TIMEOUT_S = 30.0
READY_PID = re.compile(r"([\w-]+) at [\d.]+:\d+ \(pid (\d+)\)")
ROUTER_PID = re.compile(r"^router: [\d.]+:\d+ \(pid (\d+)\)")
ANNOUNCED_URL = re.compile(r"^minipd: serving the OpenAI API .* on (http://\S+)")


class Launcher:
    """The launcher process; `pids` (child name -> pid) and `base_url` once `ready`."""

    def __init__(self, *flags: str, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        """`prefix`: what runs it (`ip netns exec NS`, to run it on another host)."""
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "minipd", "--role", "cluster", "--http-port", "0", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream, kept), daemon=True)
            for name, stream, kept in (
                ("stdout", self.process.stdout, self.stdout),
                ("stderr", self.process.stderr, self.stderr),
            )
        ]
        for reader in self._readers:
            reader.start()
        self.pids: dict[str, int] = {}
        self.base_url = ""

    def _read(self, name: str, stream, kept: list[str]) -> None:
        for line in stream:
            kept.append(line.rstrip("\n"))
            self._lines.put((name, line.rstrip("\n")))
        self._lines.put((name, None))

    def wait_line(self, stream: str, pattern: str, timeout: float) -> re.Match:
        """The first line of `stream` from now on that matches `pattern`, within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {stream} line matching {pattern!r} in {timeout} s: {self.output()}"
            try:
                name, line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if name != stream:
                continue
            assert line is not None, f"{stream} closed before a line matching {pattern!r}: {self.output()}"
            match = re.search(pattern, line)
            if match:
                return match

    def ready(self) -> "Launcher":
        """Wait for the ready lines: the children's pids and the HTTP API's URL."""
        for match in READY_PID.finditer(self.wait_line("stdout", r"^cluster ready", STARTUP_TIMEOUT_S).string):
            self.pids[match.group(1)] = int(match.group(2))
        self.pids["router"] = int(self.wait_line("stdout", ROUTER_PID.pattern, STARTUP_TIMEOUT_S).group(1))
        self.base_url = self.wait_line("stdout", ANNOUNCED_URL.pattern, STARTUP_TIMEOUT_S).group(1)
        return self

    def exit_status(self, timeout: float) -> int:
        """Its exit status, once it exited and its output was read to the end (within `timeout`)."""
        status = self.process.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
            assert not reader.is_alive(), f"its output did not end in {timeout} s (a child holds it open?)"
        return status

    def output(self) -> str:
        return "\nstdout:\n" + "\n".join(self.stdout) + "\nstderr:\n" + "\n".join(self.stderr)

    def stop(self) -> None:
        """End the launcher (SIGTERM, then SIGKILL), and any child of it still running."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        for pid in self.pids.values():
            if not gone(pid):
                os.kill(pid, 9)


def gone(pid: int) -> bool:
    """No such process, or only a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids of `pids` still running after `timeout` (bounded condition poll)."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if not gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)  # /proc has no event for another process's end (not our child: no wait())
    return left
