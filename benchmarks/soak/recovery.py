"""When a faulted cluster serves at full capacity again (the soak's per-fault recovery time).

`full_capacity_after_s(cluster, client, since, bound_s)` is the time from `since` (the end of
a fault: the SIGCONT of a pause, the kill -9 of a child) until both hold at once:

1. the router lists every instance of the cluster as alive (`ClusterClient.stats`, the
   figures behind `/admin/instances`), each by its name and, for a child the launcher
   restarted, as its new process (`cluster.children` names the new pid only once the
   supervisor's restart returned); and
2. a probe request sent after that listing (a short prompt, `PROBE_TOKENS` tokens)
   completed with every token and no error.

Until then it polls (every `POLL_S`) and sends a fresh probe after every failed one; a stats
call that fails (the router is still catching up) counts as "not yet". It raises
`NotRecovered` past `bound_s`, naming what was missing. The probe is not one of the soak's
requests: it is counted in neither `completed` nor `failed`.

After a router pause the first listing may come before the resumed router noticed its lost
instances; the probe must then still complete, so the figure is never "listed but unable to
serve", though it may be a few tens of ms shorter than the readmission itself.
"""

from __future__ import annotations

import asyncio
import time

from minipd.control.role import Role
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.router.cluster_client import ClusterClient

POLL_S = 0.05
PROBE_TOKENS = 2
PROBE = [7, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144]  # byte tokens of the tiny preset


class NotRecovered(RuntimeError):
    """The cluster was not back at full capacity within the bound."""


def instance_names(cluster: ProcessCluster) -> list[str]:
    return sorted(c.name for c in cluster.children if c.role is not Role.ROUTER)


async def listed(client: ClusterClient, timeout: float) -> list[str] | None:
    """The instances the router lists now, or None if it did not answer in time."""
    try:
        return sorted(s.instance_id for s in await client.stats(timeout=max(0.1, timeout)))
    except (TimeoutError, ConnectionError, OSError, RuntimeError):
        return None


async def probe(client: ClusterClient, timeout: float) -> bool:
    """One short request: True if it completed with every token and no error."""
    params = SamplingParams(max_tokens=PROBE_TOKENS, temperature=0.0, ignore_eos=True)
    tokens = 0
    try:
        async with asyncio.timeout(max(0.1, timeout)):
            async for output in client.generate(PROBE, params):
                tokens += len(output.token_ids)
                if output.finished:
                    return output.error is None and tokens == PROBE_TOKENS
    except (TimeoutError, ConnectionError, OSError, RuntimeError):
        return False
    return False


async def full_capacity_after_s(
    cluster: ProcessCluster, client: ClusterClient, since: float, bound_s: float, replaced: dict[str, int] | None = None
) -> float:
    """Seconds from `since` (time.monotonic) until every instance is listed and a probe completed;
    `replaced` maps a killed child's name to its old pid: its new process must be the one listed."""
    deadline = since + bound_s
    missing = "no answer from the router"
    while (left := deadline - time.monotonic()) > 0:
        replaced_now = all(cluster.child(name).process.pid != pid for name, pid in (replaced or {}).items())
        names = await listed(client, left) if replaced_now else None
        if not replaced_now:
            missing = f"the launcher had not restarted {sorted(replaced)}"
        elif names is not None and names == instance_names(cluster):
            if await probe(client, deadline - time.monotonic()):
                return time.monotonic() - since
            missing = "every instance listed, but the probe request did not complete"
        elif names is not None:
            missing = f"listed {names}, not {instance_names(cluster)}"
        await asyncio.sleep(POLL_S)  # condition poll, bounded by the deadline
    raise NotRecovered(f"not at full capacity {bound_s:.0f} s after the fault ended: {missing}")
