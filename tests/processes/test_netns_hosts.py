"""The host harness (tests/support/netns_hosts.py): hosts on one bridge reach each other at
their own addresses and nothing else; a partitioned host is cut off and reachable again
once healed; everything is removed, processes included, even when the test body fails."""

from __future__ import annotations

import subprocess
import sys

import pytest
from etcd_server import wait_until
from netns_hosts import NetnsHosts, namespaces, unavailable_reason

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")

# a TCP listener on the host's address, which answers one connection and exits
LISTEN = "import socket,sys; s=socket.create_server((sys.argv[1], 7000)); print('up', flush=True); s.accept()"
CONNECT = "import socket,sys; socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])).close()"


def connects(hosts: NetnsHosts, source: str, target: str, timeout: float = 3.0) -> bool:
    done = subprocess.run(
        [*hosts.exec_in(source), sys.executable, "-c", CONNECT, hosts.address[target], str(timeout)],
        capture_output=True,
        timeout=timeout + 30,
    )
    return done.returncode == 0


def listen(hosts: NetnsHosts, host: str) -> subprocess.Popen:
    process = hosts.spawn(host, [sys.executable, "-c", LISTEN, hosts.address[host]], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "up"
    return process


def test_hosts_reach_each_other_and_a_partition_cuts_one_off():
    with NetnsHosts(["etcd", "router", "decode"]) as hosts:
        assert len(set(hosts.address.values())) == 3
        server = listen(hosts, "etcd")
        assert connects(hosts, "router", "etcd")
        server.wait(30)
        routes = subprocess.run([*hosts.exec_in("decode"), "ip", "route"], capture_output=True, text=True).stdout
        assert "default" not in routes  # nothing leaves the segment
        listen(hosts, "etcd")
        hosts.partition("decode")
        assert not connects(hosts, "decode", "etcd", timeout=1.0)
        hosts.heal("decode")
        assert connects(hosts, "decode", "etcd")
        names = set(hosts.namespace.values()) | {hosts.switch}
        assert names <= set(namespaces())
    assert not names & set(namespaces())


def test_everything_is_removed_when_the_body_fails():
    with pytest.raises(RuntimeError, match="boom"):
        with NetnsHosts(["a", "b"]) as hosts:
            sleeper = hosts.spawn("a", [sys.executable, "-c", "import time; time.sleep(600)"])
            raise RuntimeError("boom")
    assert sleeper.poll() is not None  # killed by its id
    assert not (set(hosts.namespace.values()) | {hosts.switch}) & set(namespaces())


def test_kill_host_kills_every_process_of_the_host_and_close_any_left():
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    with NetnsHosts(["a", "b"]) as hosts:
        first = hosts.spawn("a", sleep)
        second = subprocess.Popen([*hosts.exec_in("a"), *sleep])  # not through spawn
        other = hosts.spawn("b", sleep)
        # `ip netns exec` enters the namespace just after it starts: wait for both (bounded)
        wait_until(lambda: set(hosts.pids("a")) == {first.pid, second.pid}, 30.0, "both on host a")
        assert set(hosts.kill_host("a")) == {first.pid, second.pid}
        second.wait(30)
        assert first.poll() is not None and hosts.pids("a") == []
        assert other.poll() is None  # another host's processes live on
        stray = subprocess.Popen([*hosts.exec_in("b"), *sleep])
        wait_until(lambda: stray.pid in hosts.pids("b"), 30.0, "the stray process on host b")
    stray.wait(30)  # killed by close, although it was not started through spawn
    assert other.poll() is not None
