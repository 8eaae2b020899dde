"""Stopping a child process within a bound: SIGTERM, then SIGKILL if it has not exited."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_child(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM (after SIGCONT: a frozen child cannot act on it), then SIGKILL after `timeout_s`."""
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGCONT)
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)
