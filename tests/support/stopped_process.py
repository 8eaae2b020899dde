"""Whether a process is stopped (SIGSTOP), read from /proc: a process that stops itself at a
fault point announces the point first and stops right after, so a test that resumes it must
first see it stopped, or its SIGCONT can land before the SIGSTOP and leave it stopped for good."""

from __future__ import annotations

import asyncio
import time

POLL_S = 0.001


def is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] in ("T", "t")


def wait_until_stopped(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not is_stopped(pid):
        assert time.monotonic() < deadline, f"process {pid} never stopped"
        time.sleep(POLL_S)  # condition poll, bounded: the kernel has no event for it


async def until_stopped(pid: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not is_stopped(pid):
        assert loop.time() < deadline, f"process {pid} never stopped"
        await asyncio.sleep(POLL_S)  # condition poll, bounded
