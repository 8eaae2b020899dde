"""Membership heals, inside one process (loopback KV, real TCP control plane): an instance that
ends its router's connection (as it does when the router goes silent past the liveness
bound) is redialed by the router and readmitted as a new member, and an instance that
registered itself with `--router` registers again with a router restarted on the same port.
The frozen processes themselves are tests/faults/test_membership_heals.py."""

from __future__ import annotations

import asyncio
import random

from disagg_helpers import CONFIG, LOCAL_PREFILL_MAX_TOKENS

from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.engine.engine import Engine
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.entrypoints.registration import keep_registered, register
from minipd.router.control_port import RouterControlPort
from minipd.router.registry import IncompatibleInstance
from minipd.router.router import Router
from minipd.router.router_config import RouterConfig
from minipd.transports.loopback_hub import LoopbackHub

LOCALHOST = "127.0.0.1"
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
BOUND_S = 10.0  # the first redial is at once; registering again backs off to 2 s at most
ROUTER_CONFIG = RouterConfig(local_prefill_max_tokens=LOCAL_PREFILL_MAX_TOKENS)


def _prompt(seed: int, length: int = 120) -> list[int]:
    return [random.Random(seed).randrange(256) for _ in range(length)]


async def _collect(stream) -> list:
    return [output async for output in stream]


async def _until(condition, timeout: float) -> float:
    """Wait until `condition()` holds; returns how long that took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not condition():
        assert loop.time() - start < timeout, f"not within {timeout} s"
        await asyncio.sleep(0.02)  # condition poll, bounded
    return loop.time() - start


async def _assert_pools_full(instances: list[Instance]) -> None:
    for instance in instances:
        await instance.engine.wait_idle(BOUND_S)
        await instance.reservations.wait_fenced(BOUND_S)
        stats = instance.stats()
        assert stats.num_used_blocks == 0 and stats.num_reservations == 0 and stats.num_fencing_blocks == 0, stats


def test_an_instance_that_dropped_its_router_is_redialed_and_readmitted_as_a_new_member(loop_thread):
    async def scenario():
        cluster = await InProcessCluster.start(CONFIG, num_prefill=1, num_decode=1, router_config=ROUTER_CONFIG)
        try:
            registry = cluster.router.registry
            prefill = cluster.instance("prefill-0")
            old = registry.instances["prefill-0"]
            for channel in prefill.routers:  # what it does to a router silent past the liveness bound
                await prefill.end_channel(channel, "the router went silent")
            took = await _until(lambda: registry.instances.get("prefill-0") not in (None, old), BOUND_S)
            new = registry.instances["prefill-0"]
            outputs = await asyncio.wait_for(_collect(cluster.submit(_prompt(1), PARAMS)), BOUND_S)
            await _assert_pools_full(cluster.instances)
            return (
                took,
                old,
                new.is_alive and new.channel is not old.channel,
                outputs[-1],
                cluster.router.counters.num_readmissions,
            )
        finally:
            await cluster.close()

    took, old, new_member_alive, last, readmissions = loop_thread.run(scenario(), timeout=3 * BOUND_S)
    assert old.lost.is_set() and new_member_alive
    assert readmissions == 1 and took < BOUND_S
    assert last.error is None and last.num_output_tokens == PARAMS.max_tokens
    assert last.transfer is not None and last.transfer.prefill_instance == "prefill-0"


def test_an_instance_started_with_router_registers_again_with_a_restarted_router(loop_thread):
    async def scenario():
        hub = LoopbackHub()
        instances = []
        for role in (Role.PREFILL, Role.DECODE):
            instance = await Instance.create(
                Engine(CONFIG), role, f"{role.value}-0", "loopback", CONFIG.model, {"hub": hub}
            )
            await instance.serve(LOCALHOST, 0)
            instances.append(instance)
        routers, ports, tasks = [], [], []
        try:
            for restart in range(2):
                router = Router(instances[0].engine.tokenizer, ROUTER_CONFIG, model_name=CONFIG.model)
                port = RouterControlPort(router)
                await port.serve(LOCALHOST, ports[0] if ports else 0)
                routers.append((router, port))
                ports.append(port.port)
                if restart == 0:
                    for instance in instances:
                        await register((LOCALHOST, port.port), instance.role, LOCALHOST, instance.port, None, BOUND_S)
                        tasks.append(
                            asyncio.get_running_loop().create_task(
                                keep_registered(
                                    instance, (LOCALHOST, port.port), instance.role, LOCALHOST, instance.port, None
                                )
                            )
                        )
                    await port.close()
                    await router.close()  # the router goes away: every instance is left without one
                    await _until(lambda: all(i.unrouted.is_set() for i in instances), BOUND_S)
            router = routers[1][0]
            took = await _until(lambda: len(router.registry.alive()) == 2, BOUND_S)
            outputs = await asyncio.wait_for(_collect(router.submit(_prompt(2), PARAMS)), BOUND_S)
            await _assert_pools_full(instances)
            return ports, took, outputs[-1]
        finally:
            for task in tasks:
                task.cancel()
            for router, port in routers:
                await port.close()
                await router.close()
            for instance in instances:
                await instance.close()

    ports, took, last = loop_thread.run(scenario(), timeout=3 * BOUND_S)
    assert ports[0] == ports[1] and took < BOUND_S
    assert last.error is None and last.num_output_tokens == PARAMS.max_tokens
    assert last.transfer is not None and last.transfer.prefill_instance == "prefill-0"


def test_registering_an_address_whose_instance_is_registered_answers_with_it(loop_thread):
    """A redial and the instance's own `Register` may race: the second finds the first's member."""

    async def scenario():
        cluster = await InProcessCluster.start(CONFIG, num_prefill=1, num_decode=1, router_config=ROUTER_CONFIG)
        try:
            prefill = cluster.instance("prefill-0")
            registered = cluster.router.registry.instances["prefill-0"]
            again = await asyncio.gather(
                *(cluster.router.add_instance(LOCALHOST, prefill.port, BOUND_S, Role.PREFILL) for _ in range(3))
            )
            refused = ""
            try:
                await cluster.router.add_instance(LOCALHOST, prefill.port, BOUND_S, Role.DECODE)
            except IncompatibleInstance as exc:
                refused = str(exc)
            return registered, again, len(prefill.routers), refused
        finally:
            await cluster.close()

    registered, again, num_routers, refused = loop_thread.run(scenario(), timeout=3 * BOUND_S)
    assert all(handle is registered for handle in again) and num_routers == 1
    assert "is a prefill instance, not decode" in refused
