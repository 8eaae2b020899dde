"""Pool scaling on `minipd --role cluster --launcher ray`, as users run it. On the local Ray the
launcher starts for the run: a load the decode pool cannot keep within its ITL objective makes
the ratio controller add a decode instance (the cluster has room for one: the local Ray has the
CPUs of every slot), and once the load is over and the pool idle past its window, it drains
and removes one. On a Ray with no CPU to spare, the same load makes it switch a prefill
instance instead, and the idle decode pool then gives one back. No request is lost, the KV
pools end full, the events are in the logs, /metrics and /admin/instances, and the router never
loaded Ray. Every process is identified by its pid, never by name; every wait is bounded."""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
import time

import pytest
from http_helpers import http_json, sample, scrape, wait_until_pools_full
from launcher_process import STARTUP_TIMEOUT_S, Launcher, gone, wait_gone

ray = pytest.importorskip("ray")

# An ITL objective no token meets (1 ms) and a TTFT objective every one does: the ratio
# controller wants decode.
CONTROLLER = (
    "--transport", "tcp", "--shutdown-timeout-s", "2", "--scale-idle-window-s", "3", "--scale-cooldown-s", "1",
    "--ratio-controller", "--controller-slo", "ttft:60000", "itl:1", "--controller-window-s", "2",
    "--controller-cooldown-s", "1", "--controller-interval-s", "0.25", "--controller-min-samples", "5",
)  # fmt: skip
# prefill at its minimum: only an added instance can help
SCALING = ("--launcher", "ray", "--num-prefill", "1", "--num-decode", "1", "--max-decode", "2", *CONTROLLER)
MAX_TOKENS = 24
CLIENTS = 3
ADD_BOUND_S = 240.0  # the controller's decision, then a process importing torch on a small, shared machine
REMOVE_BOUND_S = 120.0
AFTER_ADD_REQUESTS = 6  # completed while both decode instances serve
GONE_BOUND_S = 60.0
RAY_LINE = re.compile(r"^ray: ([\w-]+) on node .* actor pid (\d+), instance pid (\d+)")


class Load:
    """`CLIENTS` threads sending completions back to back until `stop`; every result kept."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.results: list[tuple[int, int | None]] = []  # (status, completion tokens)
        self.done = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for thread in self._threads:
            thread.start()

    def _client(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            prompt = f"client {index} request {n}: the pool grows"
            body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True}
            try:
                result = http_json("POST", f"{self.base_url}/v1/completions", body)
                outcome = (result.status, result.body.get("usage", {}).get("completion_tokens"))
            except Exception as exc:  # a lost request counts as one, whatever it raised
                outcome = (0, repr(exc))
            with self.done:
                self.results.append(outcome)
                self.done.notify_all()
            n += 1

    def wait_for(self, count: int, timeout: float) -> None:
        with self.done:
            assert self.done.wait_for(lambda: len(self.results) >= count, timeout), (len(self.results), count)

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
            assert not thread.is_alive(), "a client's request did not end"


def admin_instances(base_url: str) -> dict:
    result = http_json("GET", f"{base_url}/admin/instances")
    assert result.status == 200, result
    return result.body


def ray_pids(cluster: Launcher, name: str, timeout: float = 30.0) -> tuple[int, int]:
    """(actor pid, instance pid) of instance `name`, from the launcher's latest ray line on it
    (on stdout, which its reader may take a moment longer to read than stderr)."""
    deadline = time.monotonic() + timeout
    while not (
        found := [(int(m[2]), int(m[3])) for line in cluster.stdout if (m := RAY_LINE.match(line)) and m[1] == name]
    ):
        assert time.monotonic() < deadline, cluster.output()
        time.sleep(0.05)  # a bounded poll of the lines read so far
    return found[-1]


def maps_ray(pid: int) -> bool:
    """Whether process `pid` has Ray's core library loaded (it imported ray)."""
    with open(f"/proc/{pid}/maps") as maps:
        return "_raylet" in maps.read()


def test_a_load_adds_a_decode_instance_and_idle_removes_it_losing_no_request():
    started = time.monotonic()
    cluster = Launcher(*SCALING)
    load = None
    try:
        cluster.ready()
        assert any(line.startswith("scaling: prefill 1..1, decode 1..2 instances") for line in cluster.stdout)
        ready_s = time.monotonic() - started
        router_pid = cluster.pids["router"]
        initial = {name: ray_pids(cluster, name) for name in ("prefill-0", "decode-0")}

        load = Load(cluster.base_url)
        added = cluster.wait_line("stderr", r"^minipd cluster: added decode-1 \(pid (\d+)\)", ADD_BOUND_S)
        added_s = time.monotonic() - started
        new_pid = int(added[1])
        actor_pid, instance_pid = ray_pids(cluster, "decode-1")
        assert instance_pid == new_pid and not gone(new_pid)
        view = admin_instances(cluster.base_url)
        assert view["pools"]["decode"] == 2 and view["pool_bounds"]["max_decode"] == 2, view
        assert "decode-1" in {i["instance"] for i in view["instances"]}, view
        [event] = view["scale_events"]
        assert (event["action"], event["role"], event["instance"], event["state"]) == (
            "add", "decode", "decode-1", "added",
        ), view  # fmt: skip
        samples = scrape(cluster.base_url)
        assert sample(samples, "minipd_controller_scale_events_total", action="add", role="decode") == 1
        # the pool at its maximum: the controller asks for no third one while the load goes on
        load.wait_for(len(load.results) + AFTER_ADD_REQUESTS, ADD_BOUND_S)
        load.stop()
        served = len(load.results)

        cluster.wait_line("stderr", r"pool scaler: removing decode-\d \(decode pool idle", REMOVE_BOUND_S)
        removed = cluster.wait_line("stderr", r"^minipd cluster: removed (decode-\d)$", REMOVE_BOUND_S)[1]
        removed_s = time.monotonic() - started
        gone_pids = (actor_pid, instance_pid) if removed == "decode-1" else initial["decode-0"]
        assert wait_gone(list(gone_pids), GONE_BOUND_S) == [], cluster.output()
        cluster.wait_line("stderr", rf"pool scaler: removed {removed} \(decode\)", REMOVE_BOUND_S)
        assert not [line for line in cluster.stderr if f"instance {removed} lost" in line]  # it left, as asked

        # no request lost, whether it ran before, during or after the add
        assert served >= AFTER_ADD_REQUESTS
        assert load.results == [(200, MAX_TOKENS)] * served, [r for r in load.results if r != (200, MAX_TOKENS)]
        view = admin_instances(cluster.base_url)
        assert view["pools"] == {"prefill": 1, "decode": 1, "both": 0}, view
        assert [(e["action"], e["instance"], e["state"]) for e in view["scale_events"]] == [
            ("add", "decode-1", "added"),
            ("remove", removed, "removed"),
        ], view
        assert removed not in {i["instance"] for i in view["instances"]}
        samples = wait_until_pools_full(cluster.base_url)
        assert sample(samples, "minipd_controller_scale_events_total", action="remove", role="decode") == 1
        assert sample(samples, "minipd_controller_scale_failures_total", action="add", role="decode") == 0
        assert sample(samples, "minipd_pool_instances", role="decode") == 1
        assert sample(samples, "minipd_pool_bounds", role="decode", bound="max") == 2
        # the smaller pool serves, and the router never loaded Ray
        after = http_json("POST", f"{cluster.base_url}/v1/completions", {"prompt": "after", "max_tokens": 4})
        assert after.status == 200, after
        assert maps_ray(cluster.process.pid) and not maps_ray(router_pid)  # the launcher has, the router has not

        cluster.process.send_signal(signal.SIGTERM)
        assert cluster.exit_status(STARTUP_TIMEOUT_S) == 0, cluster.output()
        everyone = [router_pid, actor_pid, instance_pid, *(p for pair in initial.values() for p in pair)]
        assert wait_gone(everyone, GONE_BOUND_S) == [], cluster.output()
    finally:
        if load is not None:
            load.stop()
        cluster.stop()
    print(
        f"pool scaling on a local Ray: ready in {ready_s:.1f} s, decode-1 added {added_s - ready_s:.1f} s into the "
        f"load, {served} requests served, {removed} removed {removed_s - added_s:.1f} s after the add"
    )


def _descendants() -> set[int]:
    """The pids of this process's descendants (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rpartition(")")[2].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.fixture
def three_cpu_ray():
    """A local Ray with CPUs for three one-CPU instances, and no more; its address."""
    temp_dir = tempfile.mkdtemp(prefix="minipd-ray-scaling-")
    before = _descendants()
    context = ray.init(num_cpus=3, _temp_dir=temp_dir, namespace="minipd-scaling-tests")
    ours = sorted(_descendants() - before)
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()
        left = wait_gone(ours, GONE_BOUND_S)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert left == [], f"processes of the test's Ray still running: {left}"


def test_without_room_on_the_ray_cluster_the_controller_switches_then_idle_removes(three_cpu_ray):
    cluster = Launcher(
        "--launcher", "ray", "--ray-address", three_cpu_ray, "--num-prefill", "2", "--num-decode", "1",
        "--min-prefill", "1", "--max-decode", "2", *CONTROLLER,
    )  # fmt: skip
    load = None
    try:
        cluster.ready()
        load = Load(cluster.base_url)
        # decode wanted, prefill above its minimum, no CPU free for a fourth instance: a switch
        moved = cluster.wait_line("stderr", r"ratio controller: (prefill-\d) is a decode instance now", ADD_BOUND_S)[1]
        load.wait_for(len(load.results) + AFTER_ADD_REQUESTS, ADD_BOUND_S)
        load.stop()
        view = admin_instances(cluster.base_url)
        assert [(c["instance_id"], c["from_role"], c["to_role"]) for c in view["role_changes"]] == [
            (moved, "prefill", "decode")
        ], view
        assert view["pools"] == {"prefill": 1, "decode": 2, "both": 0}, view
        assert not [line for line in cluster.stderr if "adding" in line], cluster.output()

        # the decode pool of two goes idle: one goes, the pools end at their minimums
        removed = cluster.wait_line("stderr", r"^minipd cluster: removed ((?:prefill|decode)-\d)$", REMOVE_BOUND_S)[1]
        cluster.wait_line("stderr", rf"pool scaler: removed {removed} \(decode\)", REMOVE_BOUND_S)
        view = admin_instances(cluster.base_url)
        assert view["pools"] == {"prefill": 1, "decode": 1, "both": 0}, view
        assert [(e["action"], e["role"], e["state"]) for e in view["scale_events"]] == [
            ("remove", "decode", "removed")
        ], view
        samples = wait_until_pools_full(cluster.base_url)
        assert sample(samples, "minipd_controller_scale_events_total", action="add", role="decode") == 0
        assert sample(samples, "minipd_controller_scale_events_total", action="remove", role="decode") == 1
        served = len(load.results)
        assert load.results == [(200, MAX_TOKENS)] * served, [r for r in load.results if r != (200, MAX_TOKENS)]

        cluster.process.send_signal(signal.SIGTERM)
        assert cluster.exit_status(STARTUP_TIMEOUT_S) == 0, cluster.output()
    finally:
        if load is not None:
            load.stop()
        cluster.stop()
