"""`minipd --role cluster --launcher ray`, as users run it, on a real local Ray: started once
for the module (with custom resources to place the roles by), joined with `--ray-address`;
one run starts a Ray of its own. Every process is identified by the pids the launcher printed
and the run's temp dir, never by name."""

from __future__ import annotations

import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from http_helpers import http_json, scrape
from kvtier_stores import ALWAYS_FETCH, mooncake_missing
from launcher_process import STARTUP_TIMEOUT_S, Launcher, gone, wait_gone
from tier_conversation import (
    STORE_TIMEOUT_S,
    STORED_BLOCKS,
    TIER_HIT_TOKENS,
    TURN1_TOKENS,
    complete,
    reference_answer,
    turn_two,
)

ray = pytest.importorskip("ray")
from ray._private import state as gcs_state  # noqa: E402  (the GCS tables; the state API needs ray[default])

SMALL = ["--num-prefill", "1", "--num-decode", "1", "--transport", "tcp", "--shutdown-timeout-s", "1"]
PLACED = ["--ray-prefill-resources", '{"minipd_prefill": 1}', "--ray-decode-resources", '{"minipd_decode": 1}']
PROMPT = "The KV cache moves between prefill and decode"
RUN_TIMEOUT_S = 240.0  # a Ray start and three processes importing torch on a small, shared machine
GONE_BOUND_S = 30.0
RESTART_BOUND_S = 90.0
ACTOR_PID = re.compile(r"^ray: ([\w-]+) on node .* actor pid (\d+), instance pid (\d+)")


def _ray_rss_mib(temp_dir: str) -> float:
    """Resident memory of the Ray processes whose command line names `temp_dir`."""
    total = 0
    for pid in _pids_naming(temp_dir):
        try:
            with open(f"/proc/{pid}/status") as status:
                total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        except (FileNotFoundError, StopIteration):
            pass
    return total / 1024


def _pids_naming(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if text.encode() in cmdline.read() and not gone(int(entry)):
                        pids.append(int(entry))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
    return pids


@pytest.fixture(scope="module")
def ray_address():
    temp_dir = tempfile.mkdtemp(prefix="minipd-ray-tests-")
    started = time.monotonic()
    context = ray.init(
        num_cpus=4, resources={"minipd_prefill": 1, "minipd_decode": 1}, _temp_dir=temp_dir, namespace="minipd-tests"
    )
    print(
        f"local Ray for the module: started in {time.monotonic() - started:.1f} s, "
        f"{_ray_rss_mib(temp_dir):.0f} MiB resident"
    )
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()
        left = wait_gone(_pids_naming(temp_dir), GONE_BOUND_S)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert left == [], f"Ray processes of the module still running: {left}"


def _our_actors(state: str) -> list[dict]:
    """The GCS's records of the instance actors in `state` (ALIVE, DEAD, ...)."""
    return [a for a in gcs_state.actors().values() if "InstanceSupervisor" in repr(a) and a["State"] == state]


def _ray_metadata() -> str:
    """What Ray keeps about its actors, tasks, jobs and workers, as text."""
    events = gcs_state.state._get_all_task_events() if hasattr(gcs_state.state, "_get_all_task_events") else []
    return repr(gcs_state.actors()) + repr(gcs_state.jobs()) + repr(gcs_state.workers()) + repr(events)


def _run(*flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minipd", *flags],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )


def _token_ids(stdout: str) -> list[str]:
    return re.findall(r"token ids: (\[.*\])", stdout)


def _ray_pids(cluster: Launcher) -> dict[str, tuple[int, int]]:
    """Instance name -> (actor pid, instance pid), from the launcher's ray lines."""
    return {m[1]: (int(m[2]), int(m[3])) for line in cluster.stdout if (m := ACTOR_PID.match(line))}


def _completes(base_url: str, headers: dict | None = None) -> None:
    result = http_json("POST", f"{base_url}/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True})
    assert result.status == 200, result
    assert result.body["usage"]["completion_tokens"] == 4, result.body


@pytest.mark.parametrize(
    "flags, problem",
    [
        (["--launcher", "ray", "--ray-prefill-resources", "{not json"], "argument --ray-prefill-resources"),
        (["--launcher", "ray", "--ray-decode-resources", '{"x": -1}'], "argument --ray-decode-resources"),
        (["--launcher", "ray", "--ray-decode-resources", '{"CPU": 2}'], "argument --ray-decode-resources"),
        (["--ray-address", "127.0.0.1:1"], "ray_address: needs --launcher ray"),
        (["--launcher", "k8s"], "argument --launcher"),
    ],
)
def test_bad_ray_flags_exit_2_naming_the_flag(flags, problem):
    proc = _run("--role", "cluster", *flags, "--prompt", "x")
    assert proc.returncode == 2, proc.stderr
    assert problem in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_launcher_ray_without_ray_installed_exits_2_naming_the_extra():
    code = (
        "import sys; sys.modules['ray'] = None; from minipd.entrypoints.cli import main; "
        "sys.exit(main(['--role', 'cluster', '--launcher', 'ray', '--prompt', 'x']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'minipd[ray]'" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_placed_by_custom_resources_answers_token_exact_to_colocated(ray_address):
    started = time.monotonic()
    disagg = _run(
        "--role", "cluster", "--launcher", "ray", "--ray-address", ray_address, *SMALL, *PLACED,
        "--prompt", PROMPT, "--max-tokens", "12",
    )  # fmt: skip
    took = time.monotonic() - started
    assert disagg.returncode == 0, disagg.stdout + disagg.stderr
    colocated = _run("--role", "both", "--prompt", PROMPT, "--max-tokens", "12")
    assert colocated.returncode == 0, colocated.stderr
    assert _token_ids(disagg.stdout) == _token_ids(colocated.stdout) and len(_token_ids(colocated.stdout)) == 1
    # each role landed where its custom resource said, and runs on the CPUs Ray assigned it
    assert re.search(r"^ray: prefill-0 on node .*assigned \{CPU: 1, minipd_prefill: 1\}", disagg.stdout, re.M)
    assert re.search(r"^ray: decode-0 on node .*assigned \{CPU: 1, minipd_decode: 1\}", disagg.stdout, re.M)
    assert re.search(
        r"minipd decode: placement: 1 torch thread, pinned to CPU \d+, OMP_WAIT_POLICY=PASSIVE", disagg.stderr
    )
    print(f"--launcher ray --ray-address: prompts answered, run took {took:.1f} s")


def test_a_resource_no_node_has_fails_at_once_naming_it(ray_address):
    proc = _run(
        "--role", "cluster", "--launcher", "ray", "--ray-address", ray_address, *SMALL,
        "--ray-decode-resources", '{"minipd_gpu_node": 1}', "--prompt", "x",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(
        r"decode-0 asks Ray for \{CPU: 1, minipd_gpu_node: 1\}.*no node .* has minipd_gpu_node", proc.stderr
    )
    # no actor of that run is left waiting for a node
    assert _our_actors("ALIVE") == [] and _our_actors("PENDING_CREATION") == []


def test_device_cuda_asks_ray_for_a_gpu_per_instance(ray_address):
    # this module's Ray has no GPU: the request for one is refused at once, naming it
    proc = _run(
        "--role",
        "cluster",
        "--launcher",
        "ray",
        "--ray-address",
        ray_address,
        *SMALL,
        "--device",
        "cuda",
        "--prompt",
        "x",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"-0 asks Ray for \{CPU: 1, GPU: 1\}.*no node .* has GPU", proc.stderr), proc.stderr
    assert _our_actors("ALIVE") == [] and _our_actors("PENDING_CREATION") == []


def test_secret_stays_out_of_ray_and_a_killed_instance_is_restarted(ray_address, monkeypatch):
    secret = "s3cret-" + os.urandom(12).hex()
    monkeypatch.setenv("MINIPD_CLUSTER_SECRET", secret)
    cluster = Launcher("--launcher", "ray", "--ray-address", ray_address, *SMALL)
    try:
        cluster.ready()
        _completes(cluster.base_url)  # the instances authenticated with the router: they got the secret
        pids = _ray_pids(cluster)
        assert set(pids) == {"prefill-0", "decode-0"}, cluster.output()
        assert len(_our_actors("ALIVE")) == 2, gcs_state.actors()
        seen = _ray_metadata()
        assert "InstanceSupervisor" in seen and secret not in seen
        assert secret not in " ".join(open(f"/proc/{cluster.process.pid}/cmdline").read().split("\0"))

        old = pids["decode-0"][1]
        os.kill(old, signal.SIGKILL)
        cluster.wait_line(
            "stderr", rf"^minipd cluster: decode-0 \(pid {old}\) died \(killed by SIGKILL\)", GONE_BOUND_S
        )
        new = int(cluster.wait_line("stderr", r"^minipd cluster: decode-0 restarted \(pid (\d+)\)", RESTART_BOUND_S)[1])
        _completes(cluster.base_url)  # the only decode instance: the restarted one decoded it
        assert new != old and gone(old) and not gone(new)

        cluster.process.send_signal(signal.SIGTERM)
        assert cluster.exit_status(GONE_BOUND_S * 2) == 0, cluster.output()
        everyone = [cluster.pids["router"], new, *(actor for actor, _ in pids.values())]
        assert wait_gone(everyone, GONE_BOUND_S) == [], cluster.output()
    finally:
        cluster.stop()


def test_sigterm_of_a_launcher_with_its_own_ray_leaves_nothing_running():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    cluster = Launcher("--launcher", "ray", *SMALL)
    try:
        cluster.ready()
        temp_dir = next(
            line.rpartition(" ")[2] for line in cluster.stdout if line.startswith("ray: a local Ray for this run")
        )
        ready_s = time.monotonic() - started
        ray_mib = _ray_rss_mib(temp_dir)
        _completes(cluster.base_url)
        pids = _ray_pids(cluster)
        ray_processes = _pids_naming(temp_dir)
        assert ray_processes, cluster.output()  # its raylet and GCS at least
        cluster.process.send_signal(signal.SIGTERM)
        assert cluster.exit_status(STARTUP_TIMEOUT_S) == 0, cluster.output()
        placed = [cluster.pids["router"], *(p for pair in pids.values() for p in pair), *ray_processes]
        assert wait_gone(placed, GONE_BOUND_S) == [], cluster.output()
        assert _pids_naming(temp_dir) == [] and not os.path.exists(temp_dir)
    finally:
        cluster.stop()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        f"own local Ray: ready in {ready_s:.1f} s, Ray processes {ray_mib:.0f} MiB resident, whole run "
        f"{time.monotonic() - started:.1f} s, {used.ru_utime - before.ru_utime:.1f} s CPU in the launcher"
    )


def test_kv_tier_mooncake_runs_a_master_beside_the_launcher_that_every_instance_uses(
    ray_address, make_engine, loop_thread
):
    """`--launcher ray --kv-tier mooncake`: the launcher's own Mooncake master, at this host's
    address on Ray's network; the Ray-placed instances store into it and fetch from it (turn 2
    of a conversation gets the tier's block), and it is gone once the launcher is."""
    if mooncake_missing() is not None:
        pytest.skip(mooncake_missing())
    reference = reference_answer(make_engine, loop_thread)
    cluster = Launcher(
        "--launcher", "ray", "--ray-address", ray_address, *SMALL, "--dtype", "float32", "--kv-tier", "mooncake",
        *ALWAYS_FETCH,
    )  # fmt: skip
    try:
        cluster.ready()
        announced = re.compile(r"^kv-tier: the cluster's Mooncake master at mooncake://(.+):(\d+)$")
        where = next((m for line in cluster.stdout if (m := announced.match(line))), None)  # before `ready`
        assert where is not None and where[1] == ray.util.get_node_ip_address(), cluster.output()
        (master,) = _pids_naming(f"--rpc_port={where[2]}")

        def tier_total(name: str, **labels: str) -> float:
            samples = scrape(cluster.base_url).items()
            return sum(v for (sample, got), v in samples if sample == name and set(labels.items()) <= got)

        def reaches(name: str, value: float, **labels: str) -> float:
            """`name` once the instances' reports (polled by the router) reach `value`, within the bound."""
            deadline = time.monotonic() + STORE_TIMEOUT_S
            while (total := tier_total(name, **labels)) < value and time.monotonic() < deadline:
                time.sleep(0.1)  # poll interval of a bounded wait
            return total

        first = complete(cluster.base_url, [random.Random(7).randrange(256) for _ in range(TURN1_TOKENS)])
        assert reaches("minipd_kv_tier_blocks_stored_total", STORED_BLOCKS) == STORED_BLOCKS, cluster.output()
        turn_two(cluster.base_url, first, reference, seed=7)
        hits = reaches("minipd_kv_tier_hit_tokens_total", TIER_HIT_TOKENS, source="tier")
        assert hits == TIER_HIT_TOKENS, cluster.output()

        cluster.process.send_signal(signal.SIGTERM)
        assert cluster.exit_status(GONE_BOUND_S * 2) == 0, cluster.output()
        assert wait_gone([master], GONE_BOUND_S) == [], cluster.output()
    finally:
        cluster.stop()
