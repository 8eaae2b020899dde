"""The local-prefill policy end to end: with the prefill pool busy, prompts are prefilled on the
decode instance (same tokens as colocated), in one process and across processes, where the
launcher passes the policy flags on to its router."""

from __future__ import annotations

import msgspec
import pytest
from disagg_helpers import CONFIG, ENGINE_ARGV
from http_helpers import sample, wait_until_pools_full
from role_switch_helpers import assert_all_served, complete_all, load_prompts

from minipd.control.role import Role
from minipd.entrypoints.flags import build_parser, inherited_argv
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.policy.local_prefill import Placement
from minipd.router.router_config import RouterConfig

NUM_PROMPTS = 12
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


def test_a_busy_prefill_pool_prefills_on_decode_in_process(loop_thread, colocated):
    prompts = load_prompts(seed=3, num=NUM_PROMPTS)
    cluster = loop_thread.run(
        InProcessCluster.start(CONFIG, num_prefill=1, num_decode=1, router_config=RouterConfig(prefill_busy_requests=0))
    )
    try:
        actual = loop_thread.run(complete_all(cluster, prompts, [MAX_TOKENS] * NUM_PROMPTS))
        placements = dict(cluster.router.counters.placements)
    finally:
        loop_thread.run(cluster.close())
    expected = loop_thread.run(complete_all(colocated, prompts, [MAX_TOKENS] * NUM_PROMPTS))
    assert_all_served(expected, actual, [MAX_TOKENS] * NUM_PROMPTS)
    local = sum(a.outputs[-1].transfer is None for a in actual)
    assert placements.get(Placement.LOCAL_PREFILL_BUSY, 0) == local > 0
    assert placements.get(Placement.REMOTE, 0) == NUM_PROMPTS - local > 0


def test_the_launcher_passes_every_policy_and_controller_flag_to_its_router():
    flags = [
        "--local-prefill-max-tokens",
        "8",
        "--prefill-busy-tokens",
        "500",
        "--prefill-busy-requests",
        "3",
        "--decode-room-kv-fraction",
        "0.75",
        "--decode-room-max-running",
        "5",
        "--ratio-controller",
        "--controller-slo",
        "ttft:500",
        "itl:40",
        "--controller-window-s",
        "12",
        "--controller-cooldown-s",
        "4",
    ]
    args = build_parser(Role.CLUSTER).parse_args(["--role", "cluster", *flags])
    router_args = build_parser(Role.ROUTER).parse_args(
        ["--role", "router", *inherited_argv(args, Role.CLUSTER, Role.ROUTER)]
    )
    given = {name.lstrip("-").replace("-", "_") for name in flags if name.startswith("--")}
    assert {dest: getattr(router_args, dest) for dest in given} == {dest: getattr(args, dest) for dest in given}
    assert (router_args.prefill_busy_tokens, router_args.controller_slo) == (500, ["ttft:500", "itl:40"])
    assert router_args.ratio_controller and router_args.controller_window_s == 12
    assert "--prefill-busy-tokens" not in inherited_argv(args, Role.CLUSTER, Role.DECODE)


def test_a_busy_prefill_pool_prefills_on_decode_across_processes(loop_thread, tmp_path):

    processes = ProcessCluster.from_argv(
        ["--transport", "tcp", "--http-port", "0", "--prefill-busy-requests", "0", "--torch-threads", "1", *ENGINE_ARGV]
    )
    loop_thread.run(processes.start(), timeout=180)
    try:
        url = processes.http_url()

        async def load():
            client = await processes.client()
            try:
                return await complete_all(client, load_prompts(seed=4, num=NUM_PROMPTS), [MAX_TOKENS] * NUM_PROMPTS)
            finally:
                await client.close()

        actual = loop_thread.run(load(), timeout=120)
        samples = wait_until_pools_full(url)
    finally:
        loop_thread.run(processes.stop())
    assert all(a.outputs[-1].error is None and len(a.token_ids) == MAX_TOKENS for a in actual)
    local = sum(a.outputs[-1].transfer is None for a in actual)
    busy = sample(samples, "minipd_local_prefill_decisions_total", placement="local-prefill-busy")
    assert busy == local > 0
    assert sample(samples, "minipd_local_prefill_decisions_total", placement="remote") == NUM_PROMPTS - local
