"""Two routers switching the same instance: the one that is late gets SwitchConflict (HTTP 409,
naming the instance), never SwitchFailed (502), and nothing changes for its try.

Lateness comes in two shapes the registry's claim cannot always tell apart: the other switch
is done but this router has not learnt the new epoch yet (the instance refuses the stale
epoch), or the other switch is still draining the instance (the instance refuses a second
switch). Both are shown here with a second `Router` whose stats poll is stopped, so its view
stays the one it had before the first switch."""

from __future__ import annotations

import asyncio

import pytest
from disagg_helpers import CONFIG
from role_switch_helpers import RawRouter

from minipd.control.messages import Abort, Reserve
from minipd.control.role import Role
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.role_switch_driver import SwitchConflict
from minipd.router.router import Router

EVENT_TIMEOUT_S = 10.0
SWITCH_TIMEOUT_S = 30.0


async def other_router(cluster: InProcessCluster) -> Router:
    """A second router over the same instances that learns nothing after its handshakes."""
    other = Router(cluster.instances[0].engine.tokenizer, cluster.router.config)
    for instance in cluster.instances:
        await other.add_instance("127.0.0.1", instance.port)
    other.links._stats_task.cancel()
    return other


def test_a_switch_made_since_this_router_looked_is_a_conflict(loop_thread):
    cluster = loop_thread.run(InProcessCluster.start(CONFIG, num_prefill=1, num_decode=2))
    instance = cluster.instance("decode-1")

    async def scenario():
        other = await other_router(cluster)
        try:
            await cluster.switch_role("decode-1", Role.PREFILL)
            stale = other.registry.instances["decode-1"]
            assert (stale.role, stale.epoch) == (Role.DECODE, 0)  # its view before the switch
            with pytest.raises(SwitchConflict) as refused:
                await other.switch_role("decode-1", Role.PREFILL)
            return refused.value, stale.draining, other.role_changes
        finally:
            await other.close()

    try:
        conflict, draining, recorded = loop_thread.run(scenario())
        assert (instance.role, instance.guard.epoch) == (Role.PREFILL, 1)  # the first switch stands
        assert loop_thread.run(instance.engine.wait_idle(EVENT_TIMEOUT_S))
        assert instance.stats().num_used_blocks == 0
    finally:
        loop_thread.run(cluster.close())
    assert conflict.field == "instance"
    assert "decode-1 was switched meanwhile" in str(conflict) and "epoch 0 is stale" in str(conflict)
    assert not draining and recorded == []


def test_a_switch_while_another_drains_the_instance_is_a_conflict(loop_thread):
    cluster = loop_thread.run(InProcessCluster.start(CONFIG, num_prefill=1, num_decode=2))
    instance = cluster.instance("decode-1")

    async def scenario():
        other = await other_router(cluster)
        raw = await RawRouter.connect(instance.port)
        try:
            # a held reservation keeps the first switch draining while the second arrives
            await raw.channel.call(Reserve(request_id="held", token_ids=list(range(40)), prefill_instance="x"))
            first = asyncio.ensure_future(cluster.switch_role("decode-1", Role.PREFILL))
            await asyncio.wait_for(instance.guard.draining.wait(), EVENT_TIMEOUT_S)
            with pytest.raises(SwitchConflict) as refused:
                await other.switch_role("decode-1", Role.PREFILL)
            raw.channel.send(Abort(request_id="held"))
            report = await asyncio.wait_for(first, SWITCH_TIMEOUT_S)
            return refused.value, report
        finally:
            await raw.channel.close()
            await other.close()

    try:
        conflict, report = loop_thread.run(scenario())
        assert (instance.role, instance.guard.epoch) == (Role.PREFILL, 1)
        assert loop_thread.run(instance.engine.wait_idle(EVENT_TIMEOUT_S))
        assert instance.stats().num_used_blocks == 0
    finally:
        loop_thread.run(cluster.close())
    assert conflict.field == "instance" and "decode-1 is already switching to prefill" in str(conflict)
    assert report.to_role is Role.PREFILL and report.epoch == 1 and report.num_drained == 1
