"""The fault matrix, for every network transport installed: each cell faults one request at one
stage of its life (see fault_cells.py) on one cluster per transport (prefill and decode
instances with spares for the kills, a router), and asserts that the request completes or fails with a clear
error within the bound, that every instance has all its blocks back, and that the cluster
serves the next request."""

from __future__ import annotations

import pytest
from disagg_helpers import ENGINE_ARGV, ROUTER_ARGV
from fault_cells import BOUND_S, CELLS, CLUSTER_ARGV, PARAMS, play, probe, settled_stats, surviving

from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.transports.backends import available_transports

TRANSPORTS = ["tcp", "ucx", "nixl"]
CELL_ORDER = list(CELLS)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(
            t,
            marks=pytest.mark.skipif(
                t not in available_transports(), reason=f"the {t} extra is not installed (pip install -e '.[{t}]')"
            ),
        )
        for t in TRANSPORTS
    ],
)
def cluster(request, loop_thread, tmp_path_factory):
    fault_dir = tmp_path_factory.mktemp(f"faults-{request.param}")
    processes = ProcessCluster.from_argv(
        ["--transport", request.param, *CLUSTER_ARGV, *ENGINE_ARGV, *ROUTER_ARGV], fault_dir=str(fault_dir)
    )
    loop_thread.run(processes.start(), timeout=180)
    yield processes
    loop_thread.run(processes.stop(), timeout=120)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", CELL_ORDER)
def test_cell(cluster, loop_thread, name):
    cell = CELLS[name]
    seed = 1000 * CELL_ORDER.index(name) + TRANSPORTS.index(cluster.args.transport)
    try:
        outcome = loop_thread.run(play(cluster, cell, seed), timeout=3 * BOUND_S)
    finally:
        leftover = cluster.disarm()
    assert not leftover, f"armed but never reached: {leftover}"
    assert outcome.seconds <= BOUND_S, outcome
    if cell.expect == "complete":
        assert outcome.last_error is None and outcome.num_output_tokens == PARAMS.max_tokens, outcome
        if cell.retried_via_prefill:
            assert outcome.transfer is not None and outcome.transfer.decode_instance != outcome.faulted, outcome
    elif cell.expect == "fail":
        assert outcome.last_error and outcome.faulted in outcome.last_error, outcome
    stats = loop_thread.run(settled_stats(cluster), timeout=60)
    assert sorted(s.instance_id for s in stats) == surviving(cluster), stats
    for s in stats:
        assert s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_fencing_blocks == 0, s
        assert s.num_running == 0 and s.num_waiting == 0, s
    after = loop_thread.run(probe(cluster, seed + 500), timeout=2 * BOUND_S)
    assert after.error is None and after.num_output_tokens == PARAMS.max_tokens, after
