"""In-place role switches in one process (loopback KV, real TCP control plane): under load no
request is lost, none is served in the wrong role, no block leaks; stale epochs are refused."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from disagg_helpers import CONFIG
from role_switch_helpers import (
    RawRouter,
    assert_all_served,
    complete,
    complete_all,
    greedy,
    load_prompts,
    record_roles,
    wrong_role,
)

from minipd.control.channel import RemoteError
from minipd.control.messages import (
    DRAIN_TIMEOUT,
    STALE_EPOCH,
    Abort,
    CallError,
    Generate,
    Prefill,
    Reserve,
    SwitchRole,
)
from minipd.control.role import Role
from minipd.engine.sampling_params import InvalidRequestError
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.role_switch_driver import SwitchConflict, SwitchFailed, UnknownInstance
from minipd.router.router import Router

EVENT_TIMEOUT_S = 10.0
SWITCH_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


def start(loop_thread, num_prefill: int, num_decode: int) -> InProcessCluster:
    return loop_thread.run(InProcessCluster.start(CONFIG, num_prefill=num_prefill, num_decode=num_decode))


def assert_pools_full(cluster: InProcessCluster, loop_thread) -> None:
    for instance in cluster.instances:
        assert loop_thread.run(instance.engine.wait_idle(EVENT_TIMEOUT_S))
        stats = instance.stats()
        assert stats.num_used_blocks == 0 and stats.num_reservations == 0 and stats.num_running == 0, stats
        assert len(instance.guard.work) == 0, instance.instance_id


async def first_call(engine, name: str) -> asyncio.Event:
    """An event set the first time `engine.name` is called (the instance took work)."""
    event, original = asyncio.Event(), getattr(engine, name)

    def wrapped(*args, **kwargs):
        event.set()
        return original(*args, **kwargs)

    setattr(engine, name, wrapped)
    return event


@pytest.mark.parametrize(
    "switched, target, entry", [("prefill-0", Role.DECODE, "submit_prefill"), ("decode-1", Role.PREFILL, "adopt")]
)
def test_switch_under_load_loses_nothing_serves_nothing_wrongly_and_leaks_nothing(
    loop_thread, colocated, switched, target, entry
):
    cluster = start(loop_thread, *((2, 1) if target is Role.DECODE else (1, 2)))
    try:
        taken = record_roles(cluster.instances)
        prompts, max_tokens = load_prompts(seed=7, num=24), [8 + 3 * (i % 12) for i in range(24)]
        second = load_prompts(seed=8, num=12)
        expected = loop_thread.run(complete_all(colocated, prompts, max_tokens))
        expected2 = loop_thread.run(complete_all(colocated, second, [12] * len(second)))

        async def scenario():
            busy = await first_call(cluster.instance(switched).engine, entry)
            load = asyncio.ensure_future(complete_all(cluster, prompts, max_tokens))
            await asyncio.wait_for(busy.wait(), EVENT_TIMEOUT_S)  # it has work in flight now
            report = await cluster.switch_role(switched, target)
            fresh = cluster.instance(switched).stats()  # before any work of its new role
            first = await load
            after = await complete_all(cluster, second, [12] * len(second))
            return report, fresh, first, after

        report, fresh, first, after = loop_thread.run(scenario(), timeout=120)
        assert report.to_role is target and report.epoch == 1 and report.num_drained >= 1
        assert report.drain_s <= report.total_s and report.excluding_drain_s >= 0
        assert fresh.role is target and fresh.epoch == 1 and fresh.num_cached_blocks == 0
        assert fresh.num_free_blocks == fresh.num_blocks, "the reset pool has every block free"
        assert_all_served(expected, first, max_tokens)
        assert_all_served(expected2, after, [12] * len(second))
        assert not wrong_role(taken), wrong_role(taken)
        handle = cluster.router.registry.instances[switched]
        assert handle.role is target and handle.epoch == 1 and not handle.draining
        # it serves in its new role: some requests of the second wave used it so
        transfers = [c.outputs[-1].transfer for c in after if c.outputs[-1].transfer is not None]
        used_as = (
            {t.decode_instance for t in transfers} if target is Role.DECODE else {t.prefill_instance for t in transfers}
        )
        assert switched in used_as, transfers
        assert [t for t in taken if t.instance_id == switched and t.role == target.value]
        assert_pools_full(cluster, loop_thread)
    finally:
        loop_thread.run(cluster.close())


def test_stale_epochs_and_work_during_a_switch_are_refused(loop_thread):
    cluster = start(loop_thread, 1, 1)
    instance = cluster.instance("decode-0")

    async def scenario():
        raw = await RawRouter.connect(instance.port)
        assert raw.welcome.epoch == 0
        tokens = list(range(40))
        await raw.channel.call(Reserve(request_id="held", token_ids=tokens, prefill_instance="x", epoch=0))
        switch = asyncio.ensure_future(
            raw.channel.call(SwitchRole(role=Role.PREFILL, epoch=0, drain_timeout_s=20), SWITCH_TIMEOUT_S)
        )
        await asyncio.wait_for(instance.guard.draining.wait(), EVENT_TIMEOUT_S)
        during = []
        for epoch in (0, None):  # new work is refused during the drain, epoch or not
            try:
                await raw.channel.call(
                    Reserve(request_id=f"new-{epoch}", token_ids=tokens, prefill_instance="x", epoch=epoch)
                )
            except RemoteError as exc:
                during.append((exc.kind, str(exc)))
        raw.channel.send(Generate(request_id="gen", token_ids=tokens, sampling=greedy(4), epoch=0))
        refused_stream = await asyncio.wait_for(raw.received.get(), EVENT_TIMEOUT_S)
        assert not switch.done(), "the held reservation keeps the instance draining"
        raw.channel.send(Abort(request_id="held"))
        switched = await switch
        after = {}
        for name, message in (
            ("reserve@0", Reserve(request_id="r0", token_ids=tokens, prefill_instance="x", epoch=0)),
            ("reserve@1", Reserve(request_id="r1", token_ids=tokens, prefill_instance="x", epoch=1)),
            (
                "prefill@0",
                Prefill(
                    request_id="p0",
                    token_ids=tokens,
                    sampling=greedy(4),
                    decode_instance="y",
                    decode_description=b"",
                    decode_fingerprint=raw.welcome.fingerprint,
                    dst_block_ids=[],
                    num_skip_blocks=0,
                    epoch=0,
                ),
            ),
            ("switch@0", SwitchRole(role=Role.DECODE, epoch=0, drain_timeout_s=5)),
        ):
            try:
                await raw.channel.call(message)
                after[name] = ("served", "")
            except RemoteError as exc:
                after[name] = (exc.kind, str(exc))
        await raw.channel.close()
        return during, refused_stream, switched, after

    try:
        during, refused_stream, switched, after = loop_thread.run(scenario())
    finally:
        loop_thread.run(cluster.close())
    assert [kind for kind, _ in during] == [STALE_EPOCH, STALE_EPOCH]
    assert all("switching from decode to prefill" in text for _, text in during)
    assert isinstance(refused_stream, CallError) and refused_stream.kind == STALE_EPOCH
    assert refused_stream.request_id == "gen"
    assert switched.role is Role.PREFILL and switched.previous_role is Role.DECODE and switched.epoch == 1
    assert switched.num_drained == 1 and switched.drain_s > 0
    assert after["reserve@0"][0] == STALE_EPOCH and "epoch 0 is stale" in after["reserve@0"][1]
    assert after["prefill@0"][0] == STALE_EPOCH
    assert after["switch@0"][0] == STALE_EPOCH
    # the current epoch passes the guard, and the role check still refuses work of the other role
    assert after["reserve@1"][0] == "invalid" and "prefill instance" in after["reserve@1"][1]


def test_a_drain_that_outlasts_its_timeout_changes_nothing(loop_thread):
    cluster = start(loop_thread, 1, 2)
    instance = cluster.instance("decode-1")

    async def scenario():
        raw = await RawRouter.connect(instance.port)
        await raw.channel.call(Reserve(request_id="held", token_ids=list(range(40)), prefill_instance="x"))
        try:
            await cluster.switch_role("decode-1", Role.PREFILL, drain_timeout_s=0.2)
        except SwitchFailed as exc:
            failure = exc
        handle = cluster.router.registry.instances["decode-1"]
        state = (handle.role, handle.epoch, handle.draining, instance.role, instance.guard.epoch)
        served = await complete(cluster, list(range(100, 160)), 6)  # the cluster serves on
        raw.channel.send(Abort(request_id="held"))
        await raw.channel.close()
        return failure, state, served

    try:
        failure, state, served = loop_thread.run(scenario())
        assert_pools_full(cluster, loop_thread)
    finally:
        loop_thread.run(cluster.close())
    assert failure.kind == DRAIN_TIMEOUT and "still in flight" in str(failure)
    assert state == (Role.DECODE, 0, False, Role.DECODE, 0)
    assert served.finish_reason == "length" and len(served.token_ids) == 6


def test_a_try_refused_for_a_stale_epoch_is_retried_elsewhere(loop_thread, colocated):
    """Two routers share the instances; one switches the prefill instance, the other, which has
    not noticed yet, sends it a prompt: refused for its stale epoch, served locally instead."""
    cluster = start(loop_thread, 1, 1)
    prompt = list(range(60))

    async def scenario():
        other = Router(cluster.instances[0].engine.tokenizer, cluster.router.config)
        for instance in cluster.instances:
            await other.add_instance("127.0.0.1", instance.port)
        other.links._stats_task.cancel()  # it must not learn of the switch from its stats
        try:
            await cluster.switch_role("prefill-0", Role.DECODE)
            assert other.registry.instances["prefill-0"].role is Role.PREFILL  # its stale view
            served = await complete(other, prompt, 10)
            return served, other.counters.num_stale_retries
        finally:
            await other.close()

    try:
        served, stale_retries = loop_thread.run(scenario())
        expected = loop_thread.run(complete(colocated, prompt, 10))
        assert_pools_full(cluster, loop_thread)
    finally:
        loop_thread.run(cluster.close())
    assert stale_retries == 1
    assert served.outputs[-1].error is None and served.token_ids == expected.token_ids
    assert served.outputs[-1].transfer is None, "retried without the stale prefill instance: prefilled on decode"


def test_switch_requests_that_cannot_be_done_are_refused_naming_why(loop_thread):
    cluster = start(loop_thread, 1, 1)

    async def attempt(instance_id, role):
        try:
            await cluster.switch_role(instance_id, role)
        except (UnknownInstance, InvalidRequestError, SwitchConflict) as exc:
            return type(exc).__name__, str(exc)
        return "switched", ""

    try:
        results = {
            case: loop_thread.run(attempt(*case))
            for case in (
                ("nobody", "decode"),
                ("prefill-0", "prefil"),
                ("prefill-0", "router"),
                ("prefill-0", "prefill"),
                ("decode-0", "prefill"),
            )
        }
    finally:
        loop_thread.run(cluster.close())
    assert results[("nobody", "decode")][0] == "UnknownInstance" and "'nobody'" in results[("nobody", "decode")][1]
    assert results[("prefill-0", "prefil")][0] == "InvalidRequestError"
    assert "role" in results[("prefill-0", "prefil")][1] and "prefil" in results[("prefill-0", "prefil")][1]
    assert results[("prefill-0", "router")][0] == "InvalidRequestError"
    assert "already a prefill" in results[("prefill-0", "prefill")][1]
    assert "last instance that can decode" in results[("decode-0", "prefill")][1]
