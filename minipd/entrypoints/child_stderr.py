"""A launched child's standard error, relayed to the launcher's once the child is ready.

Until the child is ready its lines are held: a child that fails to start is reported by the
launcher in one line that quotes the child's own last line (its error), instead of the
child's output followed by the launcher's. Once it is ready (`release`), what it printed so
far and everything after is copied to the launcher's standard error as it comes.
"""

from __future__ import annotations

import asyncio
import sys

EOF_WAIT_S = 5.0  # for the pipe to close after the child exited


class ChildStderr:
    def __init__(self, stream: asyncio.StreamReader) -> None:
        self._held: list[str] = []
        self._live = False
        self._task = asyncio.get_running_loop().create_task(self._relay(stream))

    async def _relay(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line past the stream's limit: the rest of it comes next
                continue
            if not line:
                return
            text = line.decode(errors="replace")
            if self._live:
                sys.stderr.write(text)
                sys.stderr.flush()
            else:
                self._held.append(text)

    def release(self) -> None:
        """From now on every line goes to the launcher's standard error, the held ones first."""
        self._live = True
        sys.stderr.write("".join(self._held))
        sys.stderr.flush()
        self._held.clear()

    async def drained(self) -> None:
        """Once the child's stderr closed and every line was relayed or held (within `EOF_WAIT_S`)."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), EOF_WAIT_S)
        except asyncio.TimeoutError:
            pass

    async def last_line(self) -> str:
        """The child's last non-empty line, once its stderr closed."""
        await self.drained()
        return next((line.strip() for line in reversed(self._held) if line.strip()), "")

    def close(self) -> None:
        self._task.cancel()
