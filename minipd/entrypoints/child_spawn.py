"""Starting one child of a launcher: `minipd --role ROLE ARGV` as a process, up to its READY line.

`spawn_process` is shared by the local launcher (`process_cluster.py`) and the Ray actor that
runs an instance on a Ray node (`ray_instance.py`), so both start a child the same way: its
stdout is read up to `READY <role> <id> <host>:<port>` (the lines before are its
announcements), its stderr held (`child_stderr.py`) so that one that fails is reported by its
own last line.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

from minipd.control.role import Role
from minipd.entrypoints.child_stderr import ChildStderr
from minipd.entrypoints.supervisor import exit_text

READY_TIMEOUT_S = 120.0


async def spawn_process(
    name: str,
    role: Role,
    argv: list[str],
    env: dict[str, str],
    pass_fds: tuple[int, ...],
    started: Callable[[asyncio.subprocess.Process], None] = lambda process: None,
) -> tuple[asyncio.subprocess.Process, tuple[str, int], list[str], ChildStderr]:
    """Start `minipd --role ROLE ARGV` and wait for its READY line (`started` sees the process
    first); returns it, its address, the lines it printed before READY and its held stderr
    (the caller releases it). One that fails or is not ready in `READY_TIMEOUT_S` is killed:
    RuntimeError quoting its own error line."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "minipd",
        "--role",
        role.value,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        pass_fds=pass_fds,
    )
    started(process)
    stderr = ChildStderr(process.stderr)
    announcements: list[str] = []
    try:
        address = await asyncio.wait_for(_wait_ready(name, process, announcements, stderr), READY_TIMEOUT_S)
    except BaseException as exc:
        kill_process(process)
        await process.wait()
        stderr.close()
        if isinstance(exc, asyncio.TimeoutError):
            raise RuntimeError(f"{name} was not ready within {READY_TIMEOUT_S:.0f} s") from None
        raise
    return process, address, announcements, stderr


async def _wait_ready(
    name: str, process: asyncio.subprocess.Process, announcements: list[str], stderr: ChildStderr
) -> tuple[str, int]:
    while True:
        line = (await process.stdout.readline()).decode()
        if not line:
            how = exit_text(await process.wait())
            error = await stderr.last_line()
            raise RuntimeError(f"{name} failed to start ({how}): {error}" if error else f"{name} exited ({how})")
        if line.startswith("READY "):
            host, _, port = line.split()[-1].rpartition(":")
            return host, int(port)
        announcements.append(line.rstrip())


def kill_process(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:  # it exited, and asyncio has not reaped it yet
            pass
