"""Membership that a forged or overwritten etcd record cannot break for good (issue 37; a real
etcd started once for the module, real processes: one decode instance and two routers,
`--registry-ttl-s 2`).

- A switch claim on decode-0 written without a lease, under a lease that is not its router's,
  naming a router that is not in the registry, or naming a router under that router's own
  lease when it holds no such claim: no router stops serving decode-0 for it, and it is
  deleted. (Before: every router treated decode-0 as switching until a person deleted it,
  0 of 24 requests served.)
- decode-0's record overwritten with another address (without a lease, or under another
  lease) or deleted: the instance writes it back at once, and the routers serve on; an
  address change never evicts the real instance. (Before: both routers dropped it and
  dialed the other address, 96 times in 15 s; nothing served, for good.)
- A record whose address answers the handshake with another instance id or another start
  nonce: that address is not used, the router says so once, and dials it again only with a
  growing backoff.

Each case prints its time to heal: from the forged write until the key is as its owner wrote
it again and both routers serve with decode-0 taking work; it must be within one lease period
(plus a request's round trip on a busy machine).
"""

from __future__ import annotations

import time

import pytest
from etcd_server import etcd_fixture, needs_etcd, wait_until  # noqa: F401 (the fixture `etcd`)
from impostor_instance import ImpostorInstance
from registry_cluster import TTL_S, RegistryCluster, timed

from minipd.transports.backends import available_transports

pytestmark = [needs_etcd, pytest.mark.skipif("tcp" not in available_transports(), reason="no tcp transport")]

PREFIX = "/forgery"
ROUTERS = ("router-a", "router-b")
HEAL_BOUND_S = TTL_S + 1.0  # one lease period, plus the check's own requests on a busy machine
FORGER_LEASE_S = 60  # a lease of the test's: alive for the whole case
OBSERVE_S = 6.0  # how long a record naming the wrong process is watched
MAX_DIALS = 2 * 2 * 5  # two routers, two records, five dials each in OBSERVE_S (0, 0.5, 1.5, 3.5, 7.5 s)


@pytest.fixture(scope="module")
def cluster(etcd, tmp_path_factory):
    processes = RegistryCluster(etcd, PREFIX, str(tmp_path_factory.mktemp("forgery")))
    try:
        processes.start_instance("decode-0")
        for name in ROUTERS:
            processes.start_router(name)
        wait_until(lambda: healthy(processes), 30.0, "both routers serve with decode-0")
        yield processes
    finally:
        processes.stop()


@pytest.fixture(scope="module")
def impostor(cluster, loop_thread):
    """A process at another address that proves the secret and answers as decode-9."""
    server = ImpostorInstance("decode-9", cluster.secret)
    loop_thread.run(server.serve("127.0.0.1", 0))
    yield server
    loop_thread.run(server.close_connections())


def healthy(cluster: RegistryCluster) -> bool:
    """Both routers serve, each with decode-0 live and taking new work."""
    for name in ROUTERS:
        router = cluster.processes[name]
        decode = cluster.instances(router).get("decode-0")
        if decode is None or decode["switching"] or not cluster.serves(router):
            return False
    return True


@pytest.mark.parametrize("kind", ["no lease", "another lease", "router not in the registry", "its router's lease"])
def test_a_forged_switch_claim_is_not_honoured_and_is_deleted(cluster, kind):
    named = cluster.router_name(cluster.processes["router-a"])
    router, lease = named, 0
    if kind == "another lease":
        lease = cluster.grant_lease(FORGER_LEASE_S)
    elif kind == "router not in the registry":
        router, lease = "router-nowhere-1", cluster.grant_lease(FORGER_LEASE_S)
    elif kind == "its router's lease":  # router-a holds no claim: only router-a can tell it is forged
        _, lease = cluster.get(cluster.key("routers", named))
    key = cluster.key("switches", "decode-0")
    claim = {"instance_id": "decode-0", "router": router, "from_epoch": 0, "to_role": "prefill"}
    cluster.put(key, claim, lease)
    healed = lambda: cluster.get(key) is None and healthy(cluster)  # noqa: E731
    heal_s = timed(healed, HEAL_BOUND_S, f"healed from a claim ({kind})")
    print(f"forged switch claim ({kind}): healed in {heal_s:.2f} s (lease period {TTL_S} s)")
    logs = "".join(cluster.log(name) for name in ROUTERS)
    assert "not honouring the switch claim on decode-0" in logs
    if kind in ("another lease", "router not in the registry"):
        cluster.revoke(lease)


@pytest.mark.parametrize("kind", ["another address, no lease", "another address, another lease", "deleted"])
def test_an_overwritten_or_deleted_instance_record_is_written_back(cluster, etcd, impostor, kind):
    key = cluster.key("instances", "decode-0")
    real = cluster.get(key)
    dials = impostor.num_connections
    deaths = [cluster.log(name).count("decode-0 declared dead") for name in ROUTERS]
    lease = 0
    if kind == "deleted":
        etcd.ctl("del", key)
    else:
        lease = cluster.grant_lease(FORGER_LEASE_S) if kind.endswith("another lease") else 0
        cluster.put(key, {**real[0], "host": "127.0.0.1", "port": impostor.port}, lease)
    healed = lambda: cluster.get(key) == real and healthy(cluster)  # noqa: E731
    heal_s = timed(healed, HEAL_BOUND_S, f"healed from a record ({kind})")
    print(f"instance record {kind}: healed in {heal_s:.2f} s (lease period {TTL_S} s)")
    assert "; writing it again" in cluster.log("decode-0")
    if kind != "deleted":  # the real instance was never dropped for another address
        assert [cluster.log(name).count("decode-0 declared dead") for name in ROUTERS] == deaths
        assert impostor.num_connections - dials <= len(ROUTERS)
    if lease:
        cluster.revoke(lease)


def test_a_router_drops_an_address_whose_handshake_shows_another_instance(cluster, impostor):
    real, _ = cluster.get(cluster.key("instances", "decode-0"))
    at_impostor = {**real, "host": "127.0.0.1", "port": impostor.port}  # decode-0's start nonce
    lease = cluster.grant_lease(FORGER_LEASE_S)
    dials = impostor.num_connections
    for instance_id in ("decode-8", "decode-9"):  # decode-9 answers there: another id, then another start nonce
        cluster.put(cluster.key("instances", instance_id), {**at_impostor, "instance_id": instance_id}, lease)
    start = time.monotonic()
    try:
        while time.monotonic() - start < OBSERVE_S:
            for name in ROUTERS:
                router = cluster.processes[name]
                assert set(cluster.instances(router)) == {"decode-0"} and cluster.serves(router)
            time.sleep(0.2)  # sampling the routers over the observation window
        dialed = impostor.num_connections - dials
    finally:
        cluster.revoke(lease)
    print(f"records naming another process: dialed {dialed} times in {OBSERVE_S:g} s (2 routers, 2 records)")
    assert len(ROUTERS) * 2 <= dialed <= MAX_DIALS
    for name in ROUTERS:
        log = cluster.log(name)
        assert log.count("not using decode-8's record") == 1 and log.count("not using decode-9's record") == 1, log
        assert "answers as decode-9" in log


def test_the_registry_holds_only_what_its_processes_wrote(cluster):
    wait_until(
        lambda: (
            cluster.etcd.keys(f"{PREFIX}/")
            == sorted(
                [cluster.key("instances", "decode-0")]
                + [cluster.key("routers", cluster.router_name(cluster.processes[n])) for n in ROUTERS]
            )
        ),
        5.0,
        "only decode-0's and the routers' records left",
    )
    assert healthy(cluster)
