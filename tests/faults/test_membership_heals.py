"""Membership heals after freezes, as users found it: a local cluster (`minipd --role cluster
--transport tcp`, the tiny model, two prefill and one decode instance) plus a prefill instance
started by hand with `--router`, real processes, real SIGSTOP and SIGCONT.

- The router paused past the liveness bound, 6 s and 30 s (every instance drops it; on resume
  it finds them all lost, however long the pause was) serves again within `RECOVERY_BOUND_S`
  of SIGCONT with no manual step: `/health` answers 200, `/admin/instances` lists every
  instance again (the hand-started one included), requests under light load meanwhile end
  (completed or with a clear error), and every pool is full.
- A prefill instance paused past the liveness bound is declared lost, the others serve
  meanwhile, and once resumed it is readmitted within `RECOVERY_BOUND_S` and used again (a
  later request's KV comes from it).

The cluster is never told to register anything: no `rejoin`, no `Register` by hand.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

import pytest
from disagg_helpers import ENGINE_ARGV, ROUTER_ARGV
from http_helpers import http_json

from minipd.control.role import Role
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.flag_spec import CLUSTER_SECRET_ENV
from minipd.entrypoints.process_cluster import ProcessCluster

LIVENESS_S = 3.0
ROUTER_PAUSES_S = (6.0, 30.0)  # as reported, and 5x longer: past the liveness bound either way
INSTANCE_PAUSE_S = 8.0  # as reported: past the bound, the instance is declared dead
# From SIGCONT until the cluster serves again: a lost instance is redialed at once, then after
# 0.2, 0.4, ... 2 s; measured well under 1 s on this 2-core machine, the rest is margin.
RECOVERY_BOUND_S = LIVENESS_S + 5.0
REQUEST_BOUND_S = max(ROUTER_PAUSES_S) + LIVENESS_S + 20.0  # any request ends within this, faults included
SETTLE_S = 20.0
LOAD_PACING_S = 0.05
HAND_STARTED = "prefill-by-hand"
INSTANCES = sorted(["prefill-0", "prefill-1", "decode-0", HAND_STARTED])
SHORT = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _prompt(seed: int, length: int = 80) -> list[int]:
    return [random.Random(seed).randrange(256) for _ in range(length)]


@pytest.fixture(scope="module")
def cluster(loop_thread, tmp_path_factory):
    processes = ProcessCluster.from_argv(
        [
            "--transport",
            "tcp",
            "--num-prefill",
            "2",
            "--num-decode",
            "1",
            "--http-port",
            "0",
            "--liveness-timeout-s",
            str(LIVENESS_S),
            "--shutdown-timeout-s",
            "1",
            "--torch-threads",
            "1",
            *ENGINE_ARGV,
            *ROUTER_ARGV,
        ]
    )
    loop_thread.run(processes.start(), timeout=180)
    url = processes.http_url()
    log = open(tmp_path_factory.mktemp("membership") / f"{HAND_STARTED}.log", "w")
    hand = None
    try:
        hand = loop_thread.run(_start_by_hand(processes, log), timeout=120)
        client = loop_thread.run(processes.client())
        loop_thread.run(_until_listed(client, HAND_STARTED, SETTLE_S), timeout=2 * SETTLE_S)
        yield processes, client, url
        loop_thread.run(client.close())
    finally:
        for pid in [child.process.pid for child in processes.children] + ([hand.pid] if hand else []):
            try:
                os.kill(pid, signal.SIGCONT)  # a test that failed mid-freeze leaves none stopped
            except ProcessLookupError:
                pass
        if hand is not None and hand.returncode is None:
            hand.send_signal(signal.SIGTERM)
            loop_thread.run(asyncio.wait_for(hand.wait(), 30), timeout=40)
        loop_thread.run(processes.stop())
        log.close()


async def _start_by_hand(processes: ProcessCluster, log) -> asyncio.subprocess.Process:
    """`minipd --role prefill --router HOST:PORT`, as a user adds an instance to a running cluster."""
    host, port = processes.router_address
    env = {**os.environ, CLUSTER_SECRET_ENV: processes.configs.process.cluster_secret}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "minipd",
        "--role",
        Role.PREFILL.value,
        "--port",
        "0",
        "--router",
        f"{host}:{port}",
        "--instance-id",
        HAND_STARTED,
        "--transport",
        "tcp",
        "--liveness-timeout-s",
        str(LIVENESS_S),
        "--torch-threads",
        "1",
        *ENGINE_ARGV,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
        env=env,
    )
    return process


@pytest.fixture(autouse=True)
def every_instance_back_and_every_pool_full(cluster, loop_thread):
    yield
    _, client, _ = cluster
    stats = loop_thread.run(_settled(client), timeout=2 * SETTLE_S)
    assert sorted(s.instance_id for s in stats) == INSTANCES, stats
    for s in stats:
        assert s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_fencing_blocks == 0, s


async def _settled(client) -> list:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_S
    while True:
        stats = await client.stats(settle=True)
        whole = sorted(s.instance_id for s in stats) == INSTANCES and all(
            s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_fencing_blocks == 0 for s in stats
        )
        if whole or loop.time() > deadline:
            return stats
        await asyncio.sleep(0.1)  # condition poll, bounded


async def _listed(client) -> list[str]:
    return [s.instance_id for s in await asyncio.wait_for(client.stats(), REQUEST_BOUND_S)]


async def _until_listed(client, name: str, timeout: float, listed: bool = True) -> float:
    """Wait until the router lists `name` (or, with `listed=False`, no longer does); returns how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while (name in await _listed(client)) is not listed:
        assert loop.time() - start < timeout, f"{name} {'not' if listed else 'still'} listed after {timeout} s"
        await asyncio.sleep(0.05)  # condition poll, bounded
    return loop.time() - start


async def _one(client, seed: int):
    """One request, to its last output (bounded)."""
    outputs = await asyncio.wait_for(_collect(client.submit(_prompt(seed), SHORT)), REQUEST_BOUND_S)
    return outputs[-1]


async def _collect(stream) -> list:
    return [output async for output in stream]


def _signal(processes: ProcessCluster, name: str, sig: signal.Signals) -> None:
    os.kill(processes.child(name).process.pid, sig)


async def _light_load(client, stop: asyncio.Event, results: list) -> None:
    """One request at a time until `stop`; each result as (started, ended, last output)."""
    loop = asyncio.get_running_loop()
    seed = 1000
    while not stop.is_set():
        started = loop.time()
        last = await _one(client, seed)
        results.append((started, loop.time(), last))
        seed += 1
        await asyncio.sleep(LOAD_PACING_S)  # light load: the pace of the requests, not a synchronisation


@pytest.mark.parametrize("pause_s", ROUTER_PAUSES_S)
def test_a_router_paused_past_the_liveness_bound_serves_again_with_every_instance(cluster, loop_thread, pause_s):
    processes, client, url = cluster

    async def scenario():
        loop = asyncio.get_running_loop()
        stop, results = asyncio.Event(), []
        load = loop.create_task(_light_load(client, stop, results))
        try:
            await asyncio.wait_for(_until_results(results, 2), REQUEST_BOUND_S)  # load under way
            _signal(processes, "router", signal.SIGSTOP)
            try:
                await asyncio.sleep(pause_s)  # the freeze itself
            finally:
                _signal(processes, "router", signal.SIGCONT)
            resumed = loop.time()
            # serving again: a request of the load that started after the resume completed
            while not any(started >= resumed and last.error is None for started, _, last in results):
                assert loop.time() - resumed < REQUEST_BOUND_S, "no request completed after the resume"
                await asyncio.sleep(0.02)  # condition poll, bounded
            served_after_s = min(end for started, end, last in results if started >= resumed and last.error is None)
            health = await asyncio.to_thread(http_json, "GET", f"{url}/health")
            listed_after_s = [await _until_listed(client, name, RECOVERY_BOUND_S) for name in INSTANCES]
            admin = await asyncio.to_thread(http_json, "GET", f"{url}/admin/instances")
            stop.set()
            await asyncio.wait_for(load, REQUEST_BOUND_S)
        finally:
            stop.set()
            load.cancel()
        return served_after_s - resumed, health, max(listed_after_s), admin, results, resumed

    recovery_s, health, _, admin, results, resumed = loop_thread.run(scenario(), timeout=4 * REQUEST_BOUND_S)
    print(f"router paused {pause_s} s: served again {recovery_s:.2f} s after SIGCONT")
    assert recovery_s < RECOVERY_BOUND_S, recovery_s
    assert health.status == 200, health
    assert sorted(i["instance"] for i in admin.body["instances"]) == INSTANCES, admin.body
    # Requests that met the pause ended, completed or with an error saying why; none after
    # the recovery failed.
    for _, _, last in results:
        assert last.error is None or last.error.strip(), last
    recovered_at = resumed + recovery_s
    assert all(last.error is None for started, _, last in results if started >= recovered_at), results


async def _until_results(results: list, count: int) -> None:
    while len(results) < count:
        await asyncio.sleep(0.02)  # condition poll (bounded by the caller's wait_for)


def test_a_prefill_instance_paused_past_the_liveness_bound_is_declared_lost_then_rejoins_and_serves(
    cluster, loop_thread
):
    processes, client, _ = cluster

    async def scenario():
        loop = asyncio.get_running_loop()
        _signal(processes, "prefill-0", signal.SIGSTOP)
        stopped = loop.time()
        try:
            lost_after_s = await _until_listed(client, "prefill-0", LIVENESS_S + 10.0, listed=False)
            meanwhile = await asyncio.gather(*(_one(client, seed) for seed in range(4)))
            await asyncio.sleep(max(0.0, INSTANCE_PAUSE_S - (loop.time() - stopped)))  # the rest of the freeze
        finally:
            _signal(processes, "prefill-0", signal.SIGCONT)
        rejoined_after_s = await _until_listed(client, "prefill-0", RECOVERY_BOUND_S)
        # Concurrent requests spread over the prefill instances (load is counted from the pick):
        # one of them lands on the readmitted one.
        used_by: set[str] = set()
        for round_ in range(5):
            lasts = await asyncio.gather(*(_one(client, 100 + 10 * round_ + i) for i in range(4)))
            assert all(last.error is None for last in lasts), lasts
            used_by |= {last.transfer.prefill_instance for last in lasts if last.transfer is not None}
            if "prefill-0" in used_by:
                break
        return lost_after_s, meanwhile, rejoined_after_s, used_by

    lost_after_s, meanwhile, rejoined_after_s, used_by = loop_thread.run(scenario(), timeout=4 * REQUEST_BOUND_S)
    print(
        f"prefill paused {INSTANCE_PAUSE_S} s: lost after {lost_after_s:.2f} s, "
        f"rejoined {rejoined_after_s:.2f} s after SIGCONT"
    )
    assert lost_after_s < LIVENESS_S + 10.0
    for last in meanwhile:  # served by the others while it was out
        assert last.error is None, last
        assert last.transfer is None or last.transfer.prefill_instance != "prefill-0", last
    assert rejoined_after_s < RECOVERY_BOUND_S
    assert "prefill-0" in used_by, used_by
