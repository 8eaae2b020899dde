"""`minipd --role cluster --kv-tier mooncake`: the cluster's own Mooncake master, started before
the instances (whose `--kv-tier` becomes its URL) and stopped after them.

Supervised: a master that exits while the cluster runs is started again on the same ports, so
the instances' clients find it where they left it (its blocks are gone: a Mooncake master keeps
them in its clients' memory; until it is back every fetch and store is a miss, and requests are
computed). It is restarted at most `MAX_RESTARTS` times, `RESTART_DELAY_S` apart (a master
that cannot stay up must not spin); after that the cluster serves on without a tier's hits.
"""

from __future__ import annotations

import asyncio
import logging

from minipd.kvtier.mooncake_master import MasterFailed, MooncakeMaster

log = logging.getLogger(__name__)

LOCAL_MASTER = "mooncake"  # the --kv-tier value that asks the launcher for a master of its own
MAX_RESTARTS = 5
RESTART_DELAY_S = 1.0


class SupervisedMaster:
    def __init__(self, host: str = "127.0.0.1", log_path: str | None = None):
        self.master = MooncakeMaster(host, log_path=log_path)
        self.restarts = 0
        self._watch: asyncio.Task | None = None
        self._stopping = False

    @property
    def url(self) -> str:
        return self.master.url

    async def start(self) -> None:
        """Start the master (MasterFailed, FileNotFoundError if mooncake is not installed) and watch it."""
        await asyncio.to_thread(self.master.start)
        self._watch = asyncio.get_running_loop().create_task(self._supervise())

    async def _supervise(self) -> None:
        while not self._stopping:
            process = self.master.process
            if process is None:
                return
            code = await asyncio.to_thread(process.wait)
            if self._stopping or self.master.process is not process:
                return  # stopped, or killed by hand (tests) and started again by their hand
            if self.restarts >= MAX_RESTARTS:
                log.error("the KV tier's Mooncake master exited (%s) %d times; not restarting it", code, self.restarts)
                return
            self.restarts += 1
            log.warning("the KV tier's Mooncake master exited (%s); restarting it on %s", code, self.master.url)
            await asyncio.sleep(RESTART_DELAY_S)  # a pause between restarts, not a synchronisation
            try:
                self.master.process = None
                await asyncio.to_thread(self.master.start)
            except MasterFailed as exc:
                log.error("the KV tier's Mooncake master did not come back: %s", exc)
                return

    async def stop(self) -> None:
        """Stop watching, then stop the master (SIGTERM, SIGKILL after its bound)."""
        self._stopping = True
        await asyncio.to_thread(self.master.stop)
        if self._watch is not None:
            await asyncio.wait([self._watch], timeout=5.0)
            self._watch.cancel()
