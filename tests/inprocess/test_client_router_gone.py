"""A `ClusterClient` whose router went away answers every request at once with a finished
output saying the connection was lost, both for the requests it had running and for those
submitted afterwards (which must not wait forever on a connection that is gone)."""

from __future__ import annotations

import asyncio

from disagg_helpers import CONFIG

from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.cluster_client import ClusterClient
from minipd.router.control_port import RouterControlPort
from minipd.router.router_config import RouterConfig

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
TIMEOUT_S = 20.0


def test_requests_through_a_lost_router_end_at_once_saying_so(loop_thread):
    async def scenario():
        cluster = await InProcessCluster.start(CONFIG, 1, 1, RouterConfig(local_prefill_max_tokens=0))
        control = RouterControlPort(cluster.router)
        try:
            client = await ClusterClient.connect("127.0.0.1", await control.serve("127.0.0.1", 0))
            served = [o async for o in client.generate(list(range(3, 40)), GREEDY)]
            await control.close()  # the router's end of every client connection closes
            await asyncio.wait_for(client.channel.closed.wait(), TIMEOUT_S)
            late = await asyncio.wait_for(_outputs(client), TIMEOUT_S)
            await client.close()
            return served, late
        finally:
            await cluster.close()

    served, late = loop_thread.run(scenario(), timeout=60)
    assert served[-1].error is None and served[-1].finish_reason == "length"
    assert len(late) == 1 and late[0].finished, late
    assert late[0].error.startswith("connection lost"), late[0].error


async def _outputs(client: ClusterClient) -> list:
    return [o async for o in client.generate(list(range(3, 40)), GREEDY)]
