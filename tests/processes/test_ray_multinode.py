"""`minipd --role cluster --launcher ray` on a Ray cluster of several nodes (ray_nodes.py): a
head and three workers, each in a network namespace of its own with its own address, CPUs
and custom resources, joined by `--ray-address`, the launcher (and so its router) running on
the head as on a real cluster.

    head   no CPUs: the launcher and its router
    p      1 CPU, {"minipd_prefill": 1}
    d      1 CPU, {"minipd_decode": 1}
    spare  1 CPU, {"minipd_decode": 1}: room for a decode instance whose node is lost

The instances land on the nodes their resources name and answer token-exact to a colocated
engine; a killed instance process is started again by its actor; a lost node's instance comes
back on the spare; a restart loop past `--max-restarts` stops the cluster naming it; and the
launcher's exit leaves no minipd process on any node (each node's processes are read from its
namespace, by pid). The cluster is started once for the module and stopped by process ids.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from http_helpers import http_json
from launcher_process import Launcher, gone, wait_gone
from ray_nodes import NODE_DEAD_S, NodeSpec, RayNodes, ray_unavailable_reason

from minipd.entrypoints.restart_epoch import EPOCHS_PER_RESTART

REASON = ray_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"a multi-node Ray needs: {REASON}")

NODES = {
    "head": NodeSpec(0),
    "p": NodeSpec(1, {"minipd_prefill": 1}),
    "d": NodeSpec(1, {"minipd_decode": 1}),
    "spare": NodeSpec(1, {"minipd_decode": 1}),
}
DECODE_NODES = ("d", "spare")
SMALL = ["--num-prefill", "1", "--num-decode", "1", "--transport", "tcp", "--shutdown-timeout-s", "1"]
PLACED = ["--ray-prefill-resources", '{"minipd_prefill": 1}', "--ray-decode-resources", '{"minipd_decode": 1}']
PROMPT = "The KV cache moves between prefill and decode"
RUN_TIMEOUT_S = 300.0  # Ray workers and three processes importing torch on a small, shared machine
REQUEST_TIMEOUT_S = 120.0
GONE_BOUND_S = 60.0
RESTART_BOUND_S = 240.0  # the node declared dead, the actor placed again, its worker and instance started
PLACED_LINE = re.compile(r"^ray: ([\w-]+) on node ([\d.]+) .*actor pid (\d+), instance pid (\d+)")


@pytest.fixture(scope="module")
def nodes():
    started = time.monotonic()
    with RayNodes(NODES) as cluster:
        print(
            f"\nmulti-node Ray: {len(NODES)} nodes up in {cluster.started_s:.1f} s, "
            f"{cluster.rss_mib():.0f} MiB resident (every process of every node)"
        )
        yield cluster
    print(f"multi-node Ray: the module took {time.monotonic() - started:.1f} s, teardown included")


@pytest.fixture
def full(nodes):
    """The cluster with every node alive (a test before may have killed some)."""
    nodes.restore()
    return nodes


def _on_head(nodes: RayNodes, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*nodes.hosts.exec_in(nodes.head), sys.executable, "-m", "minipd", *flags],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=nodes.env(),
    )  # fmt: skip


def _launcher(nodes: RayNodes, *flags: str) -> Launcher:
    return Launcher(
        "--launcher", "ray", "--ray-address", nodes.address, *SMALL, *PLACED, *flags,
        prefix=tuple(nodes.hosts.exec_in(nodes.head)), env=nodes.env(),
    )  # fmt: skip


def _placed(lines: list[str]) -> dict[str, tuple[str, int, int]]:
    """Instance name -> (node address, actor pid, instance pid), from the launcher's ray lines."""
    return {m[1]: (m[2], int(m[3]), int(m[4])) for line in lines if (m := PLACED_LINE.match(line))}


def _minipd_processes(nodes: RayNodes) -> dict[str, dict[int, str]]:
    """Every node's processes that are minipd's: instances, the launcher, the router, actors."""
    found = {}
    for node in nodes.specs:
        mine = {pid: c for pid, c in nodes.cmdlines(node).items() if " -m minipd " in c or "InstanceSupervisor" in c}
        if mine:
            found[node] = mine
    return found


def _complete(nodes: RayNodes, url: str, max_tokens: int = 4):
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
    return nodes.head_client.call(http_json, "POST", f"{url}/v1/completions", body, timeout=REQUEST_TIMEOUT_S)


def _assert_completes(nodes: RayNodes, url: str) -> None:
    result = _complete(nodes, url)
    assert result.status == 200, result
    assert result.body["usage"]["completion_tokens"] == 4, result.body


class _InFlight:
    """A long completion sent on a thread, from the head: its result once it ended."""

    def __init__(self, nodes: RayNodes, url: str) -> None:
        self.result = None
        self.thread = threading.Thread(target=self._send, args=(nodes, url), daemon=True)
        self.thread.start()

    def _send(self, nodes: RayNodes, url: str) -> None:
        try:
            self.result = _complete(nodes, url, max_tokens=400)
        except Exception as exc:  # the connection itself failed: the check below says so
            self.result = exc

    def ended_clearly(self, instance: str, timeout: float) -> str:
        """It either completed or failed with an error naming `instance`; returns which."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the in-flight request did not end within {timeout} s"
        result = self.result
        assert not isinstance(result, Exception), result
        if result.status == 200:
            assert result.body["usage"]["completion_tokens"] == 400, result.body
            return "completed"
        assert result.status in (500, 502, 503), result
        assert instance in result.body["error"]["message"], result.body
        return f"failed ({result.status}): {result.body['error']['message']}"


def _sent(launcher: Launcher, nodes: RayNodes) -> _InFlight:
    """A long request in flight: sent, and decoding on decode-0 (as its stats say) before this returns."""
    request = _InFlight(nodes, launcher.base_url)
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while time.monotonic() < deadline and request.thread.is_alive():
        metrics = nodes.head_client.call(_metrics_text, launcher.base_url, timeout=REQUEST_TIMEOUT_S)
        if re.search(r'^minipd_requests_decoding\{instance="decode-0"\} [1-9]', metrics, re.M):
            return request
        time.sleep(0.1)  # polling the router's gauge, bounded by the deadline
    raise AssertionError(f"the long request was never seen running: {request.result}")


def _metrics_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=REQUEST_TIMEOUT_S) as response:
        return response.read().decode()


def test_disaggregated_on_three_nodes_answers_token_exact_where_resources_say(full):
    started = time.monotonic()
    disagg = _on_head(
        full, "--role", "cluster", "--launcher", "ray", "--ray-address", full.address, *SMALL, *PLACED,
        "--prompt", PROMPT, "--max-tokens", "12",
    )  # fmt: skip
    took = time.monotonic() - started
    assert disagg.returncode == 0, disagg.stdout + disagg.stderr
    colocated = subprocess.run(
        [sys.executable, "-m", "minipd", "--role", "both", "--prompt", PROMPT, "--max-tokens", "12"],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert colocated.returncode == 0, colocated.stderr
    ids = re.findall(r"token ids: (\[.*\])", disagg.stdout)
    assert ids == re.findall(r"token ids: (\[.*\])", colocated.stdout) and len(ids) == 1, disagg.stdout

    placed = _placed(disagg.stdout.splitlines())
    assert set(placed) == {"prefill-0", "decode-0"}, disagg.stdout
    assert full.node_named(placed["prefill-0"][0]) == "p", disagg.stdout
    assert full.node_named(placed["decode-0"][0]) in DECODE_NODES, disagg.stdout
    # they bound their own node's address, and the router (on the head) reached them there
    assert re.search(rf"prefill-0 at {re.escape(placed['prefill-0'][0])}:\d+ \(pid", disagg.stdout), disagg.stdout
    assert _minipd_processes(full) == {}, "the run left processes behind"
    print(f"--launcher ray on 3 nodes: prompt answered token-exact, run took {took:.1f} s")


def test_a_killed_instance_is_restarted_by_its_actor_and_served_again(full):
    cluster = _launcher(full)
    try:
        cluster.ready()
        _assert_completes(full, cluster.base_url)
        placed = _placed(cluster.stdout)
        node_ip, actor_pid, old = placed["decode-0"]
        node = full.node_named(node_ip)
        assert old in full.hosts.pids(node) and actor_pid in full.hosts.pids(node)  # it runs where the launcher says

        in_flight = _sent(cluster, full)
        killed_at = time.monotonic()
        os.kill(old, signal.SIGKILL)
        cluster.wait_line("stderr", rf"^minipd cluster: decode-0 \(pid {old}\) died \(killed by SIGKILL\)", 60)
        match = cluster.wait_line(
            "stderr", r"^minipd cluster: decode-0 restarted \(pid (\d+)\) at ([\d.]+):\d+", RESTART_BOUND_S
        )
        restarted_s = time.monotonic() - killed_at
        new = int(match[1])
        how = in_flight.ended_clearly("decode-0", REQUEST_TIMEOUT_S)
        assert match[2] == node_ip and new in full.hosts.pids(node)  # the same actor, on the same node
        _assert_completes(full, cluster.base_url)  # the only decode instance: the restarted one decoded it
        instances = full.head_client.call(
            http_json, "GET", f"{cluster.base_url}/admin/instances", timeout=REQUEST_TIMEOUT_S
        )
        (decode,) = [i for i in instances.body["instances"] if i["instance"] == "decode-0"]
        assert decode["epoch"] == EPOCHS_PER_RESTART, decode  # the restarted process: a new role epoch
        assert gone(old) and not gone(new)
        print(f"instance killed: serving again {restarted_s:.1f} s later; the request in flight {how}")
    finally:
        cluster.stop()


def test_a_lost_node_is_replaced_on_the_spare_then_a_restart_loop_stops_the_cluster(full):
    cluster = _launcher(full, "--max-restarts", "1")
    try:
        cluster.ready()
        _assert_completes(full, cluster.base_url)
        first_ip = _placed(cluster.stdout)["decode-0"][0]
        first = full.node_named(first_ip)
        other = next(n for n in DECODE_NODES if n != first)

        in_flight = _sent(cluster, full)
        killed_at = time.monotonic()
        killed = full.kill_node(first)  # its raylet, its workers, the instance: the node is lost
        cluster.wait_line("stderr", r"^minipd cluster: decode-0 \(pid \d+\) died", 60)
        match = cluster.wait_line(
            "stderr", r"^minipd cluster: decode-0 restarted \(pid (\d+)\) at ([\d.]+):\d+", RESTART_BOUND_S
        )
        back_s = time.monotonic() - killed_at
        assert match[2] == full.ip(other), cluster.output()  # Ray placed it again on the spare
        assert int(match[1]) in full.hosts.pids(other)
        how = in_flight.ended_clearly("decode-0", REQUEST_TIMEOUT_S)
        _assert_completes(full, cluster.base_url)
        instances = full.head_client.call(
            http_json, "GET", f"{cluster.base_url}/admin/instances", timeout=REQUEST_TIMEOUT_S
        )
        (decode,) = [i for i in instances.body["instances"] if i["instance"] == "decode-0"]
        assert decode["epoch"] == EPOCHS_PER_RESTART, decode  # restarted once: a new role epoch
        print(
            f"node lost ({len(killed)} processes killed; Ray declares a node dead within ~{NODE_DEAD_S:.0f} s): "
            f"decode-0 serving on the spare {back_s:.1f} s later; the request in flight {how}"
        )

        # its second node lost within --stable-after-s: past --max-restarts 1, the cluster stops
        full.kill_node(other)
        stopping = cluster.wait_line(
            "stderr", r"decode-0 .*restarted 1 times in a row \(--max-restarts 1\); stopping the cluster", 120
        )
        assert cluster.exit_status(GONE_BOUND_S * 2) == 1, cluster.output()
        left = wait_gone([pid for node in _minipd_processes(full).values() for pid in node], GONE_BOUND_S)
        assert left == [], _minipd_processes(full)
        print(f"second node lost: {stopping.string}")
    finally:
        cluster.stop()


def test_sigterm_of_the_launcher_leaves_no_process_on_any_node(full):
    cluster = _launcher(full)
    try:
        cluster.ready()
        _assert_completes(full, cluster.base_url)
        running = _minipd_processes(full)
        placed = _placed(cluster.stdout)
        for name, (ip, actor_pid, pid) in placed.items():
            assert {actor_pid, pid} <= set(running.get(full.node_named(ip), {})), (name, running)
        assert cluster.process.pid in running[full.head]  # the launcher (and its router) on the head
        print(f"serving: {full.rss_mib():.0f} MiB resident on the nodes, Ray's and minipd's processes")
        cluster.process.send_signal(signal.SIGTERM)
        assert cluster.exit_status(GONE_BOUND_S * 2) == 0, cluster.output()
        everyone = [pid for node in running.values() for pid in node]
        assert wait_gone(everyone, GONE_BOUND_S) == [], _minipd_processes(full)
        assert _minipd_processes(full) == {}
    finally:
        cluster.stop()
