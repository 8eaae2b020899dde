"""CPU placement: CPU lists, thread defaults, how the cluster launcher divides the cores, that an
engine applies its placement on its compute thread, that child processes really run pinned,
and that OpenMP's idle threads stop spinning (read back from GNU OpenMP itself)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
import torch

from minipd.control.role import Role
from minipd.engine import cpu_placement
from minipd.engine.cpu_placement import (
    CpuPlacement,
    available_cpus,
    default_torch_threads,
    format_cpu_list,
    parse_cpu_list,
    resolve,
)
from minipd.engine.engine import Engine, EngineConfig
from minipd.entrypoints.cpu_plan import ROUTER, ChildPlacement, plan_cluster
from minipd.entrypoints.process_cluster import ProcessCluster

RUN_TIMEOUT_S = 120


def test_cpu_lists_parse_and_format_like_taskset():
    assert parse_cpu_list("0-3,6") == (0, 1, 2, 3, 6)
    assert parse_cpu_list("5,1,1-2") == (1, 2, 5)
    assert format_cpu_list((0, 1, 2, 3, 6, 8, 9)) == "0-3,6,8-9"
    assert format_cpu_list(parse_cpu_list("7")) == "7"
    for bad in ("", "a", "3-1", "1-", "-2", "1,,2"):
        with pytest.raises(ValueError, match="cpus"):
            parse_cpu_list(bad)


def test_a_lone_engine_leaves_one_core_to_its_event_loop():
    assert [default_torch_threads(n) for n in (1, 2, 3, 16)] == [1, 1, 2, 15]
    assert resolve(None, None) == CpuPlacement(default_torch_threads(len(available_cpus())), None)
    assert resolve(3, None).torch_threads == 3
    assert resolve(None, None, defaults=False) == CpuPlacement(None, None)
    one = available_cpus()[:1]
    assert resolve(None, one) == CpuPlacement(1, one)


def test_the_compute_key_names_the_host_and_the_cores_or_the_device():
    host = socket.gethostname()
    assert cpu_placement.compute_key("cpu", CpuPlacement(1, (0,))) == f"{host}/cpu:0"
    everywhere = cpu_placement.compute_key("cpu", CpuPlacement(1, None))  # not pinned: the process's CPU set
    assert everywhere == f"{host}/cpu:{format_cpu_list(available_cpus())}"
    assert cpu_placement.compute_key("cuda:1", CpuPlacement(1, None)) == f"{host}/cuda:1"


def test_bad_placements_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="torch_threads"):
        resolve(0, None)
    outside = max(available_cpus()) + 1
    with pytest.raises(ValueError, match=f"cpus: {outside}: not among"):
        resolve(None, (outside,))
    with pytest.raises(ValueError, match="cpus"):
        EngineConfig(cpus=(outside,)).validate()


def test_the_launcher_gives_the_router_a_core_when_there_are_enough():
    plan = plan_cluster(["prefill-0", "decode-0"], cpus=tuple(range(8)))
    assert plan == {
        "prefill-0": ChildPlacement((0, 1, 2, 3), 3),
        "decode-0": ChildPlacement((4, 5, 6), 2),
        ROUTER: ChildPlacement((7,), None),
    }
    three = plan_cluster(["prefill-0", "decode-0"], cpus=(4, 5, 9))
    assert three == {
        "prefill-0": ChildPlacement((4,), 1),
        "decode-0": ChildPlacement((5,), 1),
        ROUTER: ChildPlacement((9,), None),
    }


def test_with_fewer_cores_than_processes_instances_split_them_and_the_router_floats():
    plan = plan_cluster(["prefill-0", "decode-0"], cpus=(0, 1))
    assert plan == {
        "prefill-0": ChildPlacement((0,), 1),
        "decode-0": ChildPlacement((1,), 1),
        ROUTER: ChildPlacement((0, 1), None),
    }
    crowded = plan_cluster(["prefill-0", "prefill-1", "decode-0"], cpus=(0, 1))
    assert [crowded[n].cpus for n in ("prefill-0", "prefill-1", "decode-0")] == [(0,), (1,), (0,)]


def test_explicit_threads_win_and_placement_can_be_turned_off():
    assert plan_cluster(["decode-0"], cpus=(0, 1, 2), torch_threads=4)["decode-0"] == ChildPlacement((0, 1), 4)
    off = plan_cluster(["prefill-0", "decode-0"], cpus=None, torch_threads=None, enabled=False)
    assert set(off.values()) == {ChildPlacement(None, None)}


def test_each_child_command_line_carries_its_share():
    cluster = ProcessCluster.from_argv(["--cpus", "0-7"])
    argv = cluster._child_argv("decode-0", Role.DECODE)
    assert argv[argv.index("--cpus") + 1] == "4-6" and argv[argv.index("--torch-threads") + 1] == "2"
    router = cluster._child_argv(ROUTER, Role.ROUTER)
    assert router[router.index("--cpus") + 1] == "7" and "--torch-threads" not in router
    assert cluster.placement_lines()[0] == "placement: prefill-0: 3 torch threads on CPUs 0-3"
    off = ProcessCluster.from_argv(["--no-cpu-placement"])._child_argv("decode-0", Role.DECODE)
    assert "--no-cpu-placement" in off and "--cpus" not in off and "--torch-threads" not in off


def test_the_engine_applies_its_placement_on_its_compute_thread():
    cpu = available_cpus()[-1]
    engine = Engine(EngineConfig.of(model="tiny", num_blocks=16, max_model_len=128, torch_threads=1, cpus=(cpu,)))
    try:
        threads, affinity = engine.run_on_compute_thread(lambda: (torch.get_num_threads(), os.sched_getaffinity(0)))
    finally:
        engine._executor.shutdown(wait=True)
    assert threads == 1 and affinity == {cpu}
    assert engine.placement.describe() == f"1 torch thread, pinned to CPU {cpu}"
    assert os.sched_getaffinity(0) == set(available_cpus())  # only the compute thread was pinned


def _allowed_cpus(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return re.search(r"^Cpus_allowed_list:\s*(\S+)", f.read(), flags=re.M).group(1)


def test_cluster_children_run_pinned_to_their_share(loop_thread):
    cores = available_cpus()
    cluster = ProcessCluster.from_argv(["--cpus", format_cpu_list(cores)])
    loop_thread.run(cluster.start(), timeout=RUN_TIMEOUT_S)
    try:
        for child in cluster.children:
            expected = cluster.placement[child.name].cpus
            assert parse_cpu_list(_allowed_cpus(child.process.pid)) == expected, child.name
    finally:
        loop_thread.run(cluster.stop())


def _spin_counts(stderr: str) -> list[str]:
    return re.findall(r"GOMP_SPINCOUNT = '(\d+)'", stderr)


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"OMP_DISPLAY_ENV": "verbose"}
    return subprocess.run(
        [sys.executable, "-m", "minipd", *argv], capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S
    )


def test_openmp_threads_stop_spinning_in_every_process():
    """GNU OpenMP prints the spin count it settled on when it loads (OMP_DISPLAY_ENV): 0 in
    the `minipd` process and in each child of a cluster; its default without placement."""
    proc = _run(["--role", "both", "--prompt", "hi", "--max-tokens", "2"])
    assert proc.returncode == 0, proc.stderr
    counts = _spin_counts(proc.stderr)
    if not counts:
        pytest.skip("torch's OpenMP runtime is not GNU OpenMP (no GOMP_SPINCOUNT printed)")
    assert counts == ["0"]
    assert "OMP_WAIT_POLICY=PASSIVE" in proc.stderr and "not in effect" not in proc.stderr
    default = _run(["--role", "both", "--prompt", "hi", "--max-tokens", "2", "--no-cpu-placement"])
    assert default.returncode == 0 and _spin_counts(default.stderr) != ["0"]
    assert "idle OpenMP threads spin" in default.stderr
    cluster = _run(["--role", "cluster", "--prompt", "Hello there, minipd!", "--max-tokens", "2"])
    assert cluster.returncode == 0, cluster.stderr
    assert _spin_counts(cluster.stderr) == ["0"] * 4  # the launcher, prefill, decode and router


def test_the_command_module_loads_no_torch_before_it_sets_the_policy():
    code = "import sys, minipd.entrypoints.cli; assert 'torch' not in sys.modules, 'torch loaded early'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr


def test_placement_flags_are_checked():
    outside = max(available_cpus()) + 1
    proc = _run(["--role", "both", "--cpus", str(outside), "--prompt", "hi"])
    assert proc.returncode == 2 and f"cpus: {outside}: not among" in proc.stderr
    proc = _run(["--role", "both", "--cpus", "3-1", "--prompt", "hi"])
    assert proc.returncode == 2 and "--cpus" in proc.stderr and "backwards" in proc.stderr
    proc = _run(["--role", "both", "--torch-threads", "0", "--prompt", "hi"])
    assert proc.returncode == 2 and "torch_threads" in proc.stderr
