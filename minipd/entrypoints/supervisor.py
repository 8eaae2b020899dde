"""The launcher watches its children and restarts the ones that die.

`Supervisor.run` waits on every child of a started `ProcessCluster`. A child that exits is
logged on stderr in one line (its name, pid and exit status or signal, or the `exit_reason`
of a process the launcher reaches through another: a Ray instance lost with its actor) and
restarted by `ProcessCluster.restart` after a backoff (`BACKOFF_FIRST_S`, doubling up to
`BACKOFF_MAX_S`): a restarted instance registers with the router as a rejoining instance
does; a restarted router listens on the ports of the one it replaces and connects to every
instance, as at start. A child restarted `max_restarts` times in a row (a child that served for
`stable_after_s` counts from 0 again), or any child under `exit_on_child_failure`, ends the
run with `ChildFailed`, a RuntimeError naming the child; the launcher then stops the
cluster and exits 1. A restart that fails (the child's own error line says why) counts as
one more death of that child. The children may change while it watches (`children_changed`):
an instance added is watched from then on, one removed is not restarted.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

from minipd.entrypoints.config_sections import ClusterConfig

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


class ChildFailed(RuntimeError):
    """A child died and is not restarted: the launcher stops the cluster and exits 1."""


def exit_text(returncode: int | None) -> str:
    """How a process ended, as `exit status 3` or `killed by SIGKILL`."""
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def backoff_s(restarts_so_far: int) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**restarts_so_far)


class Supervisor:
    def __init__(self, cluster, config: ClusterConfig) -> None:  # cluster: a started ProcessCluster
        self.cluster, self.config = cluster, config
        self._restarts: dict[str, int] = {}  # in a row, per child name
        self._started_at: dict[str, float] = {}  # when its current process started serving
        self.last_restart_s: float | None = None  # death seen to restarted child serving, the last one

    async def run(self) -> None:
        """Watch until cancelled (the launcher stops), or raise ChildFailed."""
        changed = self.cluster.children_changed
        while True:
            changed.clear()
            for child in self.cluster.children:  # one added meanwhile counts from now
                self._started_at.setdefault(child.name, time.monotonic())
            waits = {asyncio.ensure_future(c.process.wait()): c for c in self.cluster.children}
            change = asyncio.ensure_future(changed.wait())
            try:
                done, _ = await asyncio.wait([*waits, change], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in (*waits, change):
                    wait.cancel()
            for child in [waits[w] for w in done if w in waits]:  # as listed: instances before the router
                if child in self.cluster.children:  # one removed on purpose is not restarted
                    await self._after_death(child)

    async def _after_death(self, child) -> None:
        died_at = time.monotonic()
        name, pid = child.name, child.process.pid
        how = getattr(child.process, "exit_reason", None) or exit_text(child.process.returncode)
        if self.config.exit_on_child_failure:
            raise ChildFailed(f"{name} (pid {pid}) died ({how}); stopping the cluster (--exit-on-child-failure)")
        if died_at - self._started_at.get(name, died_at) >= self.config.stable_after_s:
            self._restarts[name] = 0
        what = f"{name} (pid {pid}) died ({how})"
        while True:
            restarts = self._restarts.get(name, 0)
            if restarts >= self.config.max_restarts:
                raise ChildFailed(
                    f"{what}; it was restarted {restarts} times in a row (--max-restarts "
                    f"{self.config.max_restarts}); stopping the cluster"
                )
            delay = backoff_s(restarts)
            self._restarts[name] = restarts + 1
            _say(
                f"{what}; restarting it in {delay:.1f} s (restart {restarts + 1} of at most {self.config.max_restarts})"
            )
            await asyncio.sleep(delay)  # the backoff itself
            try:
                new = await self.cluster.restart(name)
                break
            except RuntimeError as exc:  # the child's own error line says why
                what = f"{name} did not restart: {exc}"
        self._started_at[name] = time.monotonic()
        self.last_restart_s = self._started_at[name] - died_at
        host, port = new.address
        _say(
            f"{name} restarted (pid {new.process.pid}) at {host}:{port}, serving "
            f"{self.last_restart_s:.1f} s after it died"
        )


def _say(line: str) -> None:
    print(f"minipd cluster: {line}", file=sys.stderr, flush=True)
