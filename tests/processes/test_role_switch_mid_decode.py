"""In-place role switches across real processes (TCP KV), through the router's admin HTTP call:
a decode instance in the middle of decoding becomes a prefill instance and back; nothing is
lost, every request is served in a role its instance had, and no block leaks."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import msgspec
import pytest
from disagg_helpers import CONFIG, ENGINE_ARGV
from engine_helpers import Completion
from role_switch_helpers import assert_all_served, complete_all, greedy, load_prompts

from minipd.control.role import Role
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.router.cluster_client import ClusterClient
from minipd.transports.backends import available_transports

LONG_OUTPUT = 250  # long enough that the switched instance is still decoding when the switch lands (~1 s)
SHORT_OUTPUT = 10
SWITCH_TIMEOUT_S = 120.0  # the drain waits for LONG_OUTPUT-token decodes on a busy 2-core machine

pytestmark = pytest.mark.skipif("tcp" not in available_transports(), reason="no tcp transport")


@pytest.fixture(scope="module")
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


@pytest.fixture(scope="module")
def cluster(loop_thread):
    processes = ProcessCluster.from_argv(
        ["--transport", "tcp", "--num-decode", "2", "--http-port", "0", "--torch-threads", "1", *ENGINE_ARGV]
    )
    loop_thread.run(processes.start(), timeout=180)
    client = loop_thread.run(processes.client())
    url = processes.http_url()
    yield url, client
    loop_thread.run(client.close())
    loop_thread.run(processes.stop())


def post_switch(url: str, instance: str, role: Role) -> dict:
    request = urllib.request.Request(
        f"{url}/admin/switch_role",
        method="POST",
        data=json.dumps({"instance": instance, "role": role.value}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=SWITCH_TIMEOUT_S) as response:
        assert response.status == 200
        return json.loads(response.read())


async def switch(url: str, instance: str, role: Role) -> dict:
    return await asyncio.get_running_loop().run_in_executor(None, post_switch, url, instance, role)


async def all_pools_free(client: ClusterClient) -> list:
    stats = await client.stats(settle=True)
    assert all(s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_running == 0 for s in stats), stats
    return stats


def test_a_decoding_instance_becomes_a_prefill_instance_and_back(cluster, colocated, loop_thread):
    url, client = cluster
    wave1, wave2 = load_prompts(seed=21, num=8), load_prompts(seed=22, num=8)
    expected1 = loop_thread.run(complete_all(colocated, wave1, [LONG_OUTPUT] * len(wave1)))
    expected2 = loop_thread.run(complete_all(colocated, wave2, [SHORT_OUTPUT] * len(wave2)))

    async def scenario():
        streams = [client.submit(p, greedy(LONG_OUTPUT)) for p in wave1]
        firsts = [await stream.__anext__() for stream in streams]  # every request is decoding now
        report = await switch(url, "decode-1", Role.PREFILL)
        rest = []
        for stream in streams:
            rest.append([o async for o in stream])
        first = [Completion([f, *r]) for f, r in zip(firsts, rest, strict=True)]
        stats_after_switch = await all_pools_free(client)
        second = await complete_all(client, wave2, [SHORT_OUTPUT] * len(wave2))
        back = await switch(url, "decode-1", Role.DECODE)
        third = await complete_all(client, wave2[:4], [SHORT_OUTPUT] * 4)
        return report, first, stats_after_switch, second, back, third, await all_pools_free(client)

    report, first, stats_after_switch, second, back, third, final = loop_thread.run(scenario(), timeout=240)
    assert (report["from_role"], report["to_role"], report["epoch"]) == ("decode", "prefill", 1)
    assert report["num_drained"] >= 1 and 0 < report["drain_s"] <= report["total_s"]
    assert_all_served(expected1, first, [LONG_OUTPUT] * len(wave1))
    assert {c.outputs[-1].transfer.decode_instance for c in first} == {"decode-0", "decode-1"}
    assert {c.outputs[-1].transfer.prefill_instance for c in first} == {"prefill-0"}
    switched = next(s for s in stats_after_switch if s.instance_id == "decode-1")
    assert switched.role is Role.PREFILL and switched.epoch == 1 and switched.num_cached_blocks == 0
    # in its new role it prefills, and nothing is decoded there any more
    assert_all_served(expected2, second, [SHORT_OUTPUT] * len(wave2))
    transfers = [c.outputs[-1].transfer for c in second]
    assert {t.decode_instance for t in transfers} == {"decode-0"}
    assert "decode-1" in {t.prefill_instance for t in transfers}
    assert (back["to_role"], back["epoch"]) == ("decode", 2)
    assert_all_served(expected2[:4], third, [SHORT_OUTPUT] * 4)
    assert {s.instance_id: (s.role, s.epoch) for s in final} == {
        "prefill-0": (Role.PREFILL, 0),
        "decode-0": (Role.DECODE, 0),
        "decode-1": (Role.DECODE, 2),
    }
