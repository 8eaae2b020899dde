"""A process cluster whose membership lives in a real etcd (`--registry`, etcd started once
for the module): the router finds its instances there (no --prefill/--decode flags) and
serves token for token like a colocated engine; an instance that joins is used within a
second; a frozen one is dropped by its lease's expiry and rejoins by itself once it runs
again; a killed one's key is gone within the TTL; with etcd stopped the router keeps
serving, and after etcd's restart the watch resumes (an instance started then is found);
two routers switching the same instance at once: one wins, the other answers 409, and both
see the new role. Every pool is full at the end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request

import msgspec
import pytest
from disagg_helpers import CONFIG, ENGINE_ARGV
from etcd_server import EtcdServer, etcd_fixture, needs_etcd, wait_until  # noqa: F401 (the fixture `etcd`)
from minipd_process import Process
from role_switch_helpers import assert_all_served, complete_all, load_prompts

from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.transports.backends import available_transports

pytestmark = [needs_etcd, pytest.mark.skipif("tcp" not in available_transports(), reason="no tcp transport")]

TTL_S = 2
PREFIX = "/etcdtest"
OUTPUT = 8
JOIN_BOUND_S = 1.0  # a new instance is used within a second of publishing itself
DROP_BOUND_S = TTL_S + 2.0  # the lease's TTL, plus etcd's expiry sweep and the watch


@pytest.fixture(scope="module")
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


@pytest.fixture(scope="module")
def cluster(etcd, loop_thread):
    processes = ProcessCluster.from_argv(
        [
            "--registry",
            etcd.url(PREFIX),
            "--registry-ttl-s",
            str(TTL_S),
            "--liveness-timeout-s",
            "120",  # so that only the lease declares a frozen instance dead
            "--transport",
            "tcp",
            "--http-port",
            "0",
            "--torch-threads",
            "1",
            *ENGINE_ARGV,
        ]
    )
    extra: list[Process] = []
    try:
        loop_thread.run(processes.start(), timeout=240)
        client = loop_thread.run(processes.client())
        yield processes, client, extra
        loop_thread.run(client.close())
    finally:
        for process in extra:
            process.stop()
        loop_thread.run(processes.stop(), timeout=120)


def start_instance(processes: ProcessCluster, etcd: EtcdServer, name: str, role: str = "decode") -> Process:
    return Process(
        [
            "--role",
            role,
            "--instance-id",
            name,
            "--port",
            "0",
            "--registry",
            etcd.url(PREFIX),
            "--registry-ttl-s",
            str(TTL_S),
            "--liveness-timeout-s",
            "120",
            "--transport",
            "tcp",
            "--torch-threads",
            "1",
            *ENGINE_ARGV,
        ],
        processes.configs.process.cluster_secret,
    )


def live_ids(loop_thread, client) -> set[str]:
    return {s.instance_id for s in loop_thread.run(client.stats())}


def serve_and_check(loop_thread, client, colocated, seed: int, num: int = 6) -> list:
    prompts = load_prompts(seed=seed, num=num)
    expected = loop_thread.run(complete_all(colocated, prompts, [OUTPUT] * num))
    actual = loop_thread.run(complete_all(client, prompts, [OUTPUT] * num), timeout=120)
    assert_all_served(expected, actual, [OUTPUT] * num)
    return actual


def assert_pools_full(loop_thread, client) -> None:
    stats = loop_thread.run(client.stats(settle=True))
    assert stats and all(
        s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_running == 0 and s.num_fencing_blocks == 0
        for s in stats
    ), stats


def test_instances_found_in_the_registry_serve_like_colocated(cluster, etcd, colocated, loop_thread):
    processes, client, _ = cluster
    assert "--prefill" not in processes.child("router").argv and "--decode" not in processes.child("router").argv
    assert etcd.keys(f"{PREFIX}/instances/") == [f"{PREFIX}/instances/decode-0", f"{PREFIX}/instances/prefill-0"]
    assert live_ids(loop_thread, client) == {"prefill-0", "decode-0"}
    actual = serve_and_check(loop_thread, client, colocated, seed=1)
    assert {c.outputs[-1].transfer.prefill_instance for c in actual} == {"prefill-0"}
    assert_pools_full(loop_thread, client)


def test_a_new_instance_is_used_within_a_second_and_a_frozen_one_is_dropped_by_its_lease(
    cluster, etcd, colocated, loop_thread
):
    processes, client, extra = cluster
    joining = start_instance(processes, etcd, "decode-join")
    extra.append(joining)
    published = time.monotonic()  # its READY line follows its publication
    wait_until(lambda: "decode-join" in live_ids(loop_thread, client), JOIN_BOUND_S + 1.0, "decode-join in use")
    join_s = time.monotonic() - published
    assert join_s <= JOIN_BOUND_S + 0.5, join_s  # the stats round trip of the check itself included
    actual = serve_and_check(loop_thread, client, colocated, seed=2, num=8)
    assert {c.outputs[-1].transfer.decode_instance for c in actual} == {"decode-0", "decode-join"}

    frozen = time.monotonic()
    os.kill(joining.popen.pid, signal.SIGSTOP)  # its connection stays open: only the lease can tell
    wait_until(lambda: "decode-join" not in live_ids(loop_thread, client), DROP_BOUND_S + 2.0, "decode-join dropped")
    drop_s = time.monotonic() - frozen
    assert drop_s <= DROP_BOUND_S, drop_s
    assert f"{PREFIX}/instances/decode-join" not in etcd.keys(f"{PREFIX}/instances/")
    serve_and_check(loop_thread, client, colocated, seed=3)  # served without it

    os.kill(joining.popen.pid, signal.SIGCONT)  # it runs again: a new lease, published again, readmitted
    wait_until(lambda: "decode-join" in live_ids(loop_thread, client), 30.0, "decode-join back")

    joining.popen.kill()
    joining.popen.wait(30)
    wait_until(lambda: "decode-join" not in live_ids(loop_thread, client), 5.0, "the killed decode-join dropped")
    wait_until(
        lambda: f"{PREFIX}/instances/decode-join" not in etcd.keys(f"{PREFIX}/instances/"),
        DROP_BOUND_S,
        "the killed instance's key expired",
    )
    print(f"joined and used in {join_s:.2f} s; a frozen instance dropped in {drop_s:.2f} s (TTL {TTL_S} s)")
    assert_pools_full(loop_thread, client)


def test_serving_goes_on_while_etcd_is_down_and_the_watch_resumes(cluster, etcd, colocated, loop_thread):
    processes, client, extra = cluster
    etcd.stop()
    try:
        serve_and_check(loop_thread, client, colocated, seed=4)  # with the membership it knows
        assert live_ids(loop_thread, client) == {"prefill-0", "decode-0"}
    finally:
        etcd.start()
    late = start_instance(processes, etcd, "decode-late")
    extra.append(late)
    wait_until(lambda: "decode-late" in live_ids(loop_thread, client), 10.0, "decode-late found after the restart")
    assert live_ids(loop_thread, client) == {"prefill-0", "decode-0", "decode-late"}
    serve_and_check(loop_thread, client, colocated, seed=5)
    assert_pools_full(loop_thread, client)


def post_switch(url: str, instance: str, role: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/admin/switch_role",
        method="POST",
        data=json.dumps({"instance": instance, "role": role}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def roles_seen(url: str) -> dict[str, tuple[str, int]]:
    with urllib.request.urlopen(f"{url}/admin/instances", timeout=30) as response:
        return {i["instance"]: (i["role"], i["epoch"]) for i in json.loads(response.read())["instances"]}


def test_two_routers_switching_one_instance_one_wins_and_both_see_it(cluster, etcd, colocated, loop_thread):
    processes, client, extra = cluster
    second = Process(
        ["--role", "router", "--port", "0", "--http-port", "0", "--registry", etcd.url(PREFIX),
         "--registry-ttl-s", str(TTL_S), "--liveness-timeout-s", "120"],
        processes.configs.process.cluster_secret,
    )  # fmt: skip
    extra.append(second)
    first_url = processes.http_url()
    urls = [first_url, second.http_url]
    everyone = {"prefill-0", "decode-0", "decode-late"}
    # the second router finds every instance; with a 2 s lease on a busy machine an instance's
    # record may have lapsed and been written back meanwhile (membership heals): both routers
    # see all of them again within a few leases
    for url in urls:
        wait_until(lambda url=url: set(roles_seen(url)) == everyone, 10 * TTL_S, f"{url} sees {sorted(everyone)}")
    assert roles_seen(urls[1]) == roles_seen(urls[0])

    async def both():
        loop = asyncio.get_running_loop()
        return await asyncio.gather(
            *(loop.run_in_executor(None, post_switch, url, "decode-late", "prefill") for url in urls)
        )

    answers = loop_thread.run(both(), timeout=180)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 409], answers
    conflict = next(body for status, body in answers if status == 409)
    assert "decode-late" in conflict["error"]["message"], conflict
    for url in urls:  # the winner switched it; the other router saw the new epoch through the watch
        wait_until(lambda url=url: roles_seen(url).get("decode-late") == ("prefill", 1), 2.0, f"{url} sees it")
    assert etcd.keys(f"{PREFIX}/switches/") == []
    serve_and_check(loop_thread, client, colocated, seed=6)
    assert_pools_full(loop_thread, client)
