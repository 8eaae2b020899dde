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
import select
import threading
import time

import msgspec
import pytest
from cluster_load import Load, check
from disagg_helpers import CONFIG, LOCAL_PREFILL_MAX_TOKENS, assert_same_tokens, first_wave, run_all
from etcd_server import needs_etcd, wait_until
from netns_cluster import INSTANCES, PREFIX, ROUTERS, TTL_S, NetnsCluster, since
from netns_hosts import NetnsHosts, unavailable_reason
from role_switch_helpers import assert_all_served, complete_all, load_prompts

from minipd.ops.registry.election import DEPOSED_AFTER
from minipd.transports.backends import available_transports

REASON = unavailable_reason()
pytestmark = [
    needs_etcd,
    pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}"),
    pytest.mark.skipif("tcp" not in available_transports(), reason="no tcp transport"),
]

OUTPUT = 24
LONG_OUTPUT = 300
CONCURRENCY = 6
DROP_BOUND_S = TTL_S + 3.0  # the lease's TTL, etcd's expiry sweep, the watch (the CI machine is slow)
REJOIN_BOUND_S = 20.0
SETTLE_S = 30.0
ETCD_OUTAGE_S = 10.0


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
def colocated(make_engine):
    return make_engine(**msgspec.structs.asdict(CONFIG))


@pytest.fixture(scope="module")
def expected(prompts, colocated, loop_thread):
    """The colocated engine's greedy tokens for each prompt of the load."""
    return [c.token_ids for c in loop_thread.run(complete_all(colocated, prompts, [OUTPUT] * len(prompts)), 120)]


def fresh_requests_use(cluster: NetnsCluster, colocated, loop_thread, seed: int) -> set[str]:
    """Prompts no pool has seen, through each router, served token for token like colocated
    ones: the instances they went to. (The load's prompts are cached where they ran before:
    cache-aware picking keeps them on those prefill instances, and a decode instance that
    holds a prompt's blocks prefills it itself, so only new prompts show where work goes.)"""
    used = set()
    for i, router in enumerate(ROUTERS):
        prompts = load_prompts(seed=seed + i, num=2 * CONCURRENCY, min_len=40, max_len=300)
        expected = loop_thread.run(complete_all(colocated, prompts, [OUTPUT] * len(prompts)), 120)
        actual = cluster.client.run(complete_all(cluster.clients[router], prompts, [OUTPUT] * len(prompts)), 120)
        assert_all_served(expected, actual, [OUTPUT] * len(prompts))
        used |= {
            name
            for a in actual
            for name in (a.outputs[-1].transfer.prefill_instance, a.outputs[-1].transfer.decode_instance)
        }
    return used


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
    assert "decode-b" in loser_body["error"]["message"] and loser_body["error"]["param"] == "instance", loser_body
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


def test_a_decode_host_killed_under_load(cluster, prompts, expected, colocated, loop_thread, record_property):
    whole(cluster)
    running = Running(cluster, prompts)
    killed_at = time.monotonic()
    killed = cluster.kill_host("decode-a")
    for router in ROUTERS:
        wait_until(lambda r=router: "decode-a" not in cluster.seen(r), DROP_BOUND_S, f"{router} dropped decode-a")
    detect_s = since(killed_at)
    running.progress(2 * CONCURRENCY, since_t=time.monotonic(), what="served by decode-b alone")
    restarted = cluster.start("decode-a")
    for router in ROUTERS:
        wait_until(lambda r=router: "decode-a" in cluster.seen(r), REJOIN_BOUND_S, f"{router} took decode-a back")
    rejoin_s = since(restarted.ready_at)
    assert "decode-a" in fresh_requests_use(cluster, colocated, loop_thread, seed=300)
    counts = check(running.finish(), expected, OUTPUT, lost={"decode-a"})
    print(f"decode host killed ({len(killed)} processes): {counts}")
    assert counts["completed"] > 3 * CONCURRENCY and counts["connection lost"] == 0, counts
    assert detect_s <= DROP_BOUND_S
    figure(record_property, "killed decode host dropped by both routers", detect_s)
    figure(record_property, "restarted decode instance used, after its READY", rejoin_s)
    figure(
        record_property, "restarted decode instance READY, after its start", restarted.ready_at - restarted.started_at
    )
    assert_pools_full(cluster)


def test_a_router_host_killed_under_load(cluster, prompts, expected, record_property):
    whole(cluster)
    running = Running(cluster, prompts)
    cluster.kill_host("router-b")
    running.progress(2 * CONCURRENCY, since_t=time.monotonic(), what="served through router-a alone")
    assert cluster.get("router-a", "/health") == {"status": "ok"}  # what a load balancer checks
    outcomes = running.finish()
    stopped_at = time.monotonic()
    assert_pools_full(cluster, routers=["router-a"])  # the instances dropped router-b's work
    settle_s = since(stopped_at)
    counts = check(outcomes, expected, OUTPUT)
    assert all(o.error is None for o in outcomes if o.router == "router-a"), counts
    assert counts["completed"] > 2 * CONCURRENCY, counts
    restarted = cluster.start("router-b")  # READY once connected to every instance in etcd
    assert set(cluster.seen("router-b")) == set(INSTANCES)
    assert cluster.get("router-b", "/health") == {"status": "ok"}
    again = Running(cluster, prompts, routers=["router-b"])
    check(again.finish(), expected, OUTPUT)
    print(f"router host killed: {counts}")
    figure(record_property, "pools full (router-b's work dropped), after the load stopped", settle_s)
    figure(
        record_property,
        "restarted router READY (every instance connected), after its start",
        restarted.ready_at - restarted.started_at,
    )
    assert_pools_full(cluster)


def test_a_prefill_host_cut_off_longer_than_its_lease_is_dropped_and_rejoins_by_itself(
    cluster, prompts, expected, colocated, loop_thread, record_property
):
    whole(cluster)
    running = Running(cluster, prompts)
    cut_at = time.monotonic()
    cluster.hosts.partition("prefill-a")
    try:
        for router in ROUTERS:
            wait_until(lambda r=router: "prefill-a" not in cluster.seen(r), DROP_BOUND_S, f"{router} dropped prefill-a")
        detect_s = since(cut_at)
        running.progress(2 * CONCURRENCY, since_t=time.monotonic(), what="served with prefill-b alone")
        # cut off for longer than its lease in any case, whenever its last refresh was
        wait_until(lambda: since(cut_at) > TTL_S + 1.0, TTL_S + 2.0, "the partition outlasted the lease")
    finally:
        cluster.hosts.heal("prefill-a")
    healed_at = time.monotonic()
    for router in ROUTERS:
        wait_until(lambda r=router: "prefill-a" in cluster.seen(r), REJOIN_BOUND_S, f"{router} took prefill-a back")
    rejoin_s = since(healed_at)
    assert "prefill-a" in fresh_requests_use(cluster, colocated, loop_thread, seed=500)
    counts = check(running.finish(), expected, OUTPUT, lost={"prefill-a"})
    print(f"prefill host cut off for {healed_at - cut_at:.1f} s: {counts}")
    assert counts["completed"] > 3 * CONCURRENCY and counts["connection lost"] == 0, counts
    figure(record_property, "cut-off prefill host dropped by both routers", detect_s)
    figure(record_property, "healed prefill host back in both routers", rejoin_s)
    assert_pools_full(cluster)


def test_serving_goes_on_while_etcd_is_down_and_changes_meanwhile_are_picked_up(
    cluster, prompts, expected, colocated, loop_thread, record_property
):
    whole(cluster)
    running = Running(cluster, prompts)
    stopped_at = time.monotonic()
    cluster.etcd.stop()
    try:
        running.progress(2 * CONCURRENCY, since_t=time.monotonic(), what="serving without etcd")
        cluster.kill_host("decode-b")  # a departure while etcd is down: its connections close
        for router in ROUTERS:
            wait_until(lambda r=router: "decode-b" not in cluster.seen(r), DROP_BOUND_S, f"{router} dropped decode-b")
        restarted = cluster.start("decode-b", wait=False)  # a join while etcd is down: it waits for etcd
        running.progress(2 * CONCURRENCY, since_t=time.monotonic(), what="serving without etcd or decode-b")
        # no lease can be refreshed: the leader steps down before its lease could expire
        wait_until(lambda: not any(cluster.leader(r) for r in ROUTERS), TTL_S * DEPOSED_AFTER + 2.0, "no leader")
        deposed_s = since(stopped_at)
        wait_until(lambda: since(stopped_at) >= ETCD_OUTAGE_S, ETCD_OUTAGE_S + 5.0, "etcd down for its outage")
        assert "decode-b" not in cluster.seen("router-a")
    finally:
        cluster.etcd.start()  # returns once etcd answers
    back_at = time.monotonic()
    outage_s = back_at - stopped_at
    cluster.wait_ready("decode-b")
    for router in ROUTERS:
        wait_until(lambda r=router: "decode-b" in cluster.seen(r), REJOIN_BOUND_S, f"{router} found decode-b")
    join_s = since(back_at)
    wait_until(lambda: sum(cluster.leader(r) for r in ROUTERS) == 1, REJOIN_BOUND_S, "a controller elected again")
    elect_s = since(back_at)
    assert "decode-b" in fresh_requests_use(cluster, colocated, loop_thread, seed=700)
    outcomes = running.finish()
    counts = check(outcomes, expected, OUTPUT, lost={"decode-b"})
    print(f"etcd down for {outage_s:.1f} s: {counts}")
    during = [o for o in outcomes if stopped_at <= o.started and o.ended <= back_at]
    assert len(during) >= 4 * CONCURRENCY and all(o.error is None or "decode-b" in o.error for o in during)
    assert restarted.ready_at > back_at  # it could not publish itself before
    figure(record_property, "leader stepped down, after etcd stopped", deposed_s)
    figure(record_property, "instance started during the etcd outage used, after etcd returned", join_s)
    figure(record_property, "controller elected again, after etcd returned", elect_s)
    assert_pools_full(cluster)


def test_the_leader_router_killed_mid_switch_the_controller_moves_and_the_switch_completes_or_changes_nothing(
    cluster, prompts, expected, colocated, loop_thread, record_property
):
    whole(cluster)
    (leader,) = wait_until(lambda: [r for r in ROUTERS if cluster.leader(r)], SETTLE_S, "a leader")
    (follower,) = [r for r in ROUTERS if r != leader]
    role, epoch, _ = cluster.seen(follower)["decode-b"]
    # long streams first, while nothing else runs: the router spreads them over both decode
    # instances, so switching decode-b drains for seconds, not milliseconds
    long_prompts = load_prompts(seed=900, num=4, min_len=40, max_len=100)
    long_expected = loop_thread.run(complete_all(colocated, long_prompts, [LONG_OUTPUT] * 4), 120)
    long_served = cluster.client.submit(complete_all(cluster.clients[follower], long_prompts, [LONG_OUTPUT] * 4))
    wait_until(
        lambda: all(s.num_running > 0 for s in cluster.stats(follower) if s.role.value == "decode"),
        SETTLE_S,
        "long streams on both decode instances",
    )
    running = Running(cluster, prompts)
    claims = cluster.etcd.watch(f"{PREFIX}/switches/", cluster.etcd.revision() + 1)
    try:
        answer: list = []
        switching = threading.Thread(
            target=lambda: answer.append(_try_post(cluster, leader, {"instance": "decode-b", "role": "prefill"}))
        )
        switching.start()
        # the leader's claim is in etcd: the switch is under way; its host dies at that moment
        assert select.select([claims.stdout], [], [], SETTLE_S)[0], "no claim put"
        assert claims.stdout.readline().strip() == "PUT"
        killed_at = time.monotonic()
        cluster.kill_host(leader)
    finally:
        claims.kill()
        claims.wait(30)
    switching.join(30)
    (reply,) = answer
    assert isinstance(reply, Exception), reply  # the leader died before answering: the switch was in flight
    wait_until(lambda: cluster.leader(follower), DROP_BOUND_S, f"{follower} elected")
    takeover_s = since(killed_at)
    wait_until(lambda: not cluster.seen(follower)["decode-b"][2], SETTLE_S, "the switch over, one way or the other")
    settled_s = since(killed_at)
    after = cluster.seen(follower)["decode-b"]
    assert after in {("prefill", epoch + 1, False), (role, epoch, False)}, after  # done, or nothing changed
    stats = {s.instance_id: s for s in cluster.stats(follower)}["decode-b"]
    assert (stats.role.value, stats.epoch, stats.switching) == after  # the instance agrees
    assert cluster.etcd.keys(f"{PREFIX}/switches/") == []
    assert_all_served(long_expected, long_served.result(120), [LONG_OUTPUT] * 4)  # the drain let them finish
    # the survivor moves it freely (no claim left behind), back to two prefill and two decode
    for target in ("prefill", "decode") if after[0] == "decode" else ("decode",):
        status, body = cluster.post(follower, "/admin/switch_role", {"instance": "decode-b", "role": target})
        assert status == 200, body
    counts = check(running.finish(), expected, OUTPUT)
    print(f"leader killed mid-switch ({'completed' if after[0] == 'prefill' else 'nothing changed'}): {counts}")
    assert counts["completed"] > CONCURRENCY, counts
    figure(record_property, "controller taken over after the leader's host died", takeover_s)
    figure(record_property, "switch in flight settled after the leader's host died", settled_s)
    assert_pools_full(cluster, routers=[follower])


def _try_post(cluster: NetnsCluster, router: str, body: dict):
    """The switch's answer, or the error of a router that died before answering."""
    try:
        return cluster.post(router, "/admin/switch_role", body)
    except Exception as exc:  # the connection reset by the router's death
        return exc
