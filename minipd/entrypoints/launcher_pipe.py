"""A launcher's children stop by themselves when the launcher dies, whatever killed it.

The launcher opens one pipe (`LauncherPipe`) and keeps its write end to itself; each child
inherits only the read end (`pass_fds`), its number in `MINIPD_LAUNCHER_FD`. The child
(`watch_launcher`, called by `cli.py` right after its flags are parsed) reads that pipe on a
daemon thread: the read returns only once every write end is closed, which the kernel does
when the launcher exits, SIGKILL included. The child then shuts down as on SIGTERM (its
requests get `--shutdown-timeout-s`), and kills itself if that has not ended it a grace
period later.

Why a pipe rather than Linux's `prctl(PR_SET_PDEATHSIG)`: the parent-death signal fires when
the *thread* that forked the child exits, and a launcher's event loop may run on any thread
(tests and benchmarks run `ProcessCluster` on a loop thread); it needs code between fork and
exec (a `preexec_fn`, unsafe with threads) and a check for a parent that died before the
call; and it is Linux only. The pipe is open before the child exists, so a launcher that
dies before the child starts watching is seen at once, and it works on every POSIX system.
"""

from __future__ import annotations

import os
import signal
import threading
import time

ENV_FD = "MINIPD_LAUNCHER_FD"
KILL_GRACE_S = 10.0  # after the child's own shutdown deadline


class LauncherPipe:
    """The launcher's end: `child_env` and `pass_fds` for each child it starts; `close` once
    every child is stopped (closing it stops every child still running)."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()  # neither is inherited unless passed (PEP 446)

    def child_env(self) -> dict[str, str]:
        return {ENV_FD: str(self._read_fd)}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read_fd,)

    def close(self) -> None:
        for fd in (self._write_fd, self._read_fd):
            os.close(fd)


def watch_launcher(shutdown_timeout_s: float) -> None:
    """In a child: shut down once the launcher that started it is gone (no-op when started by
    none)."""
    text = os.environ.pop(ENV_FD, None)  # this process's own children must not look for it
    if text is None:
        return
    fd = int(text)
    threading.Thread(target=_wait_then_stop, args=(fd, shutdown_timeout_s), name="launcher-watch", daemon=True).start()


def _wait_then_stop(fd: int, shutdown_timeout_s: float) -> None:
    try:
        while os.read(fd, 1):  # the launcher never writes: only EOF (or an error) ends this
            pass
    except OSError:
        pass
    # stdout and stderr were pipes to the launcher: writing to them now would fail mid-shutdown
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (1, 2):
        os.dup2(devnull, stream)
    os.kill(os.getpid(), signal.SIGTERM)  # the graceful shutdown of every role
    time.sleep(shutdown_timeout_s + KILL_GRACE_S)  # a deadline on this daemon thread, not a synchronisation
    os.kill(os.getpid(), signal.SIGKILL)
