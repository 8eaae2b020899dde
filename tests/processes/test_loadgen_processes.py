"""Servers the bench starts are always stopped, with every process they started themselves."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from benchmarks.loadgen.processes import ManagedProcess, Processes

GONE_TIMEOUT_S = 10.0
# A child that starts a grandchild, says where it is, and then waits to be stopped: the shape
# of `minipd --role cluster` and its instances.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"READY {child.pid}", flush=True)
time.sleep(600)
"""


def is_gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, waiting for its parent to reap it)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while not is_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polling /proc for the kernel to finish the kill
    return True


def ready_pid(line: str) -> int | None:
    return int(line.split()[1]) if line.startswith("READY ") else None


@pytest.mark.parametrize("how", ["normally", "failing", "interrupted"])
def test_children_and_grandchildren_are_stopped_however_the_block_ends(how):
    error = {"normally": None, "failing": RuntimeError("boom"), "interrupted": KeyboardInterrupt()}[how]
    pids = []
    try:
        with Processes() as processes:
            child = processes.start("parent", [sys.executable, "-c", PARENT])
            pids = [child.process.pid, child.wait_for_line(ready_pid, 30)]
            child.drain()
            if error is not None:
                raise error
    except (RuntimeError, KeyboardInterrupt) as exc:
        assert exc is error
    assert len(pids) == 2 and all(wait_gone(pid) for pid in pids)


def test_a_child_that_exits_before_announcing_is_reported_with_its_log():
    with pytest.raises(RuntimeError, match="exited with status 3") as info:
        with Processes() as processes:
            child = processes.start(
                "broken", [sys.executable, "-c", "import sys; print('bad flag: --nope', file=sys.stderr); sys.exit(3)"]
            )
            child.wait_for_line(ready_pid, 30)
    assert "bad flag: --nope" in str(info.value)


def test_waiting_for_an_announcement_is_bounded():
    with Processes() as processes:
        child = processes.start("silent", [sys.executable, "-c", "import time; time.sleep(600)"])
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="did not get ready"):
            child.wait_for_line(ready_pid, 0.5)
        assert time.monotonic() - start < 5
        pid = child.process.pid
    assert wait_gone(pid)


def test_a_second_interrupt_while_stopping_waits_until_every_child_is_gone(monkeypatch):
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)  # what bench.py installs
    original_stop = ManagedProcess.stop

    def stop_with_a_signal(self):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the cleanup
        return original_stop(self)

    monkeypatch.setattr(ManagedProcess, "stop", stop_with_a_signal)
    pids = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with Processes() as processes:
                for name in ("first", "second"):
                    child = processes.start(name, [sys.executable, "-c", PARENT])
                    pids += [child.process.pid, child.wait_for_line(ready_pid, 30)]
                    child.drain()
                raise RuntimeError("the run failed")  # the first interruption of the run
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(pids) == 4 and all(wait_gone(pid) for pid in pids)
