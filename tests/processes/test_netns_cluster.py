"""minipd across hosts: etcd, two routers, two prefill and two decode instances of `tiny`, each
on a host of its own (network namespaces on one bridge, netns_cluster.py), started once for
the module, membership in etcd with 2 s leases, KV over tcp between the hosts' addresses. The
test process is a client on a host of its own.

Each scenario keeps a load running through both routers while it breaks something and
asserts that every request completed token for token like a colocated engine or failed with
a clear error, none was lost or served twice (cluster_load.py), and every surviving pool is
full again at the end. In order: disaggregated output equals colocated; two routers switch
one instance at once (one wins, the other answers 409); every process of a decode host is
killed, then of a router host; a prefill host is cut off longer than its lease, then healed;
etcd is stopped for 10 s; the leader router's host is killed with a role switch in flight.
Detection and recovery times are printed (`-s`) and recorded as test properties.
"""

from __future__ import annotations

import itertools
import threading
import time

import msgspec
import pytest
from cluster_load import Load, check
from disagg_helpers import CONFIG, LOCAL_PREFILL_MAX_TOKENS, assert_same_tokens, first_wave, run_all
from etcd_server import needs_etcd, wait_until
from netns_cluster import INSTANCES, PREFIX, ROUTERS, TTL_S, NetnsCluster, since
from netns_hosts import NetnsHosts, unavailable_reason
from role_switch_helpers import complete_all, load_prompts

from minipd.engine.request import INSTANCE_LOST
from minipd.transports.backends import available_transports

REASON = unavailable_reason()
pytestmark = [
    needs_etcd,
    pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}"),
    pytest.mark.skipif("tcp" not in available_transports(), reason="no tcp transport"),
]

OUTPUT = 24
CONCURRENCY = 6
DROP_BOUND_S = TTL_S + 3.0  # the lease's TTL, etcd's expiry sweep, the watch (the CI machine is slow)
REJOIN_BOUND_S = 20.0
SETTLE_S = 30.0


@pytest.fixture(scope="module")
def cluster():
    with NetnsHosts(list(HOSTS_ORDER)) as hosts:
        cluster = NetnsCluster(hosts)
        try:
            cluster.start_all()
            yield cluster
        finally:
            cluster.close()


HOSTS_ORDER = ("etcd", *ROUTERS, *INSTANCES, "client")


@pytest.fixture(scope="module")
def prompts():
    return load_prompts(seed=21, num=16, min_len=40, max_len=300)


@pytest.fixture(scope="module")
def expected(prompts, make_engine, loop_thread):
    """The colocated engine's greedy tokens for each prompt."""
    colocated = make_engine(**msgspec.structs.asdict(CONFIG))
    return [c.token_ids for c in loop_thread.run(complete_all(colocated, prompts, [OUTPUT] * len(prompts)), 120)]


def figure(record_property, name: str, seconds: float) -> None:
    """A measured time: printed and kept in the test report."""
    record_property(name, round(seconds, 3))
    print(f"netns figure: {name} = {seconds:.2f} s")


def whole(cluster: NetnsCluster) -> None:
    """Every process runs, each router knows every instance: what each scenario starts from."""
    for host in (*INSTANCES, *ROUTERS):
        assert cluster.running(host), f"{host} is not running:\n{cluster.log_tail(host)}"
    for router in ROUTERS:
        wait_until(lambda r=router: set(cluster.seen(r)) == set(INSTANCES), SETTLE_S, f"{router} sees every instance")


def assert_pools_full(cluster: NetnsCluster, routers=ROUTERS) -> None:
    """Every router sees every instance with no request, reservation or fenced block left."""

    def full(router: str):
        stats = cluster.stats(router, settle=True)
        idle = all(
            s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_running == 0 and s.num_fencing_blocks == 0
            for s in stats
        )
        return idle and {s.instance_id for s in stats} == set(INSTANCES) and stats

    for router in routers:
        wait_until(lambda r=router: full(r), SETTLE_S, f"every pool full as {router} sees it", interval=0.2)


class Running:
    """A `Load` running on the client host's loop until `finish`."""

    def __init__(self, cluster: NetnsCluster, prompts, routers=ROUTERS):
        self.cluster = cluster
        self.load = Load({r: cluster.clients[r] for r in routers}, prompts, OUTPUT, CONCURRENCY)
        self.future = cluster.client.submit(self.load.run())
        self.started = time.monotonic()
        self.progress(CONCURRENCY, since_t=self.started, what="the load runs")

    def progress(self, n: int, since_t: float, what: str, timeout: float = 60.0, **where) -> None:
        """Wait until `n` requests that started after `since_t` completed."""
        wait_until(lambda: self.load.completed_since(since_t, **where) >= n, timeout, what, interval=0.05)

    def finish(self, timeout: float = 120.0):
        self.cluster.client.loop.call_soon_threadsafe(self.load.stop)
        return self.future.result(timeout)


def test_every_listener_binds_its_hosts_address(cluster):
    for host in (*INSTANCES, *ROUTERS, "etcd"):
        address = cluster.hosts.address[host]
        listeners = cluster.listeners(host)
        assert listeners, host
        assert {a.rsplit(":", 1)[0] for a in listeners} == {address}, (host, listeners)
    assert len(cluster.listeners("prefill-a")) == 2  # its control port and its tcp KV port


def test_disaggregated_across_hosts_equals_colocated(cluster, make_engine, loop_thread):
    whole(cluster)
    colocated = make_engine(**msgspec.structs.asdict(CONFIG))
    for seed, (kind, router) in enumerate(itertools.product(("greedy", "sampled"), ROUTERS)):
        # prompts new to every pool: long ones go to a prefill host, their KV to a decode host
        prompts = first_wave(seed=100 + seed)
        expected = loop_thread.run(run_all(colocated, prompts, kind), 120)
        actual = cluster.client.run(run_all(cluster.clients[router], prompts, kind), 120)
        assert_same_tokens(expected, actual, prompts)
        transfers = [a.outputs[-1].transfer for a in actual if a.outputs[-1].transfer is not None]
        long = [p for p in prompts if len(p) > LOCAL_PREFILL_MAX_TOKENS]
        assert len(transfers) == len(long), (router, kind, len(transfers), len(long))
        assert all(t.num_bytes > 0 and t.prefill_instance != t.decode_instance for t in transfers)
        assert {t.prefill_instance for t in transfers} == {"prefill-a", "prefill-b"}, (router, kind)
        assert {t.decode_instance for t in transfers} == {"decode-a", "decode-b"}, (router, kind)
    assert_pools_full(cluster)


def test_two_routers_switching_one_instance_one_wins_the_other_gets_409(cluster, record_property):
    whole(cluster)
    role, epoch, _ = cluster.seen("router-a")["decode-b"]
    assert role == "decode"
    answers: dict[str, tuple[int, dict]] = {}
    go = threading.Barrier(len(ROUTERS))

    def switch(router: str) -> None:
        go.wait(30)  # both POSTs leave together
        answers[router] = cluster.post(router, "/admin/switch_role", {"instance": "decode-b", "role": "prefill"})

    threads = [threading.Thread(target=switch, args=(r,)) for r in ROUTERS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert sorted(status for status, _ in answers.values()) == [200, 409], answers
    (winner,) = [r for r, (status, _) in answers.items() if status == 200]
    loser_body = next(body for status, body in answers.values() if status == 409)
    assert "decode-b" in loser_body["error"]["message"], loser_body
    for router in ROUTERS:
        wait_until(
            lambda r=router: cluster.seen(r)["decode-b"] == ("prefill", epoch + 1, False), 5.0, f"{router} sees it"
        )
    assert cluster.etcd.keys(f"{PREFIX}/switches/") == []
    back = cluster.post(winner, "/admin/switch_role", {"instance": "decode-b", "role": "decode"})
    assert back[0] == 200, back
    for router in ROUTERS:
        wait_until(
            lambda r=router: cluster.seen(r)["decode-b"] == ("decode", epoch + 2, False), 5.0, f"{router} sees it"
        )
    figure(record_property, "contested switch answered", answers[winner][1]["total_s"])
    assert_pools_full(cluster)
