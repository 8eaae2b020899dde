"""The ratio controller's election against a real etcd (started once for the module).

In process: of two campaigners exactly one holds `P/controller/leader` (its name the value,
under its lease); when it closes, the other is elected; a leader whose refreshes stop
counting (its clock jumped past half the TTL, as after a freeze) is not leader at once, and
steps down; a leader key no campaign wrote (no lease, or naming a campaigner that did not
win it) is deleted and a campaigner elected within the TTL. As users run it: two `minipd
--role router --ratio-controller --registry` processes: exactly one reports `leader: true` (GET /admin/controller and
`minipd_controller_leader`); SIGKILL the leader and the other takes over within the TTL plus a
bound; SIGSTOP the leader for longer than the TTL and the other takes over, and the old one,
resumed, reports not leader from its first answer on (no moment with two leaders)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request

from etcd_server import etcd_fixture, needs_etcd, wait_until  # noqa: F401 (the fixture `etcd`)
from minipd_process import Process

from minipd.ops.registry.election import DEPOSED_AFTER, ControllerElection, leader_key
from minipd.ops.registry.etcd_client import EtcdEndpoints
from minipd.ops.registry.etcd_url import parse_registry_url

pytestmark = needs_etcd

TTL_S = 2
TIMEOUT_S = 20.0
TAKEOVER_BOUND_S = TTL_S + 3.0  # the lease's TTL, etcd's expiry sweep, the watch, a campaign
SECRET = "election-test-secret-0123456789abcdef"


class Candidate:
    """A campaigner whose controller is a list of what happened to it."""

    def __init__(self, url, name: str, clock=time.monotonic):
        self.events: list[str] = []
        self.changed = asyncio.Event()
        self.election = ControllerElection(
            EtcdEndpoints(url), url.prefix, TTL_S, name, self._elected, self._deposed, clock=clock
        )

    def _elected(self) -> None:
        self.events.append("elected")
        self.changed.set()

    async def _deposed(self) -> None:
        self.events.append("deposed")
        self.changed.set()

    async def wait_for(self, count: int, event: str) -> None:
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S
        while self.events.count(event) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), deadline - asyncio.get_running_loop().time())


def test_of_two_campaigners_one_wins_and_the_other_takes_over_when_it_leaves(etcd):
    url = parse_registry_url(etcd.url("/elect1"))

    async def scenario():
        a, b = Candidate(url, "router-a"), Candidate(url, "router-b")
        try:
            a.election.start()
            b.election.start()
            done, _ = await asyncio.wait(
                [asyncio.create_task(c.wait_for(1, "elected")) for c in (a, b)],
                timeout=TIMEOUT_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
            assert done
            winner, loser = (a, b) if a.election.leader else (b, a)
            held = etcd.ctl("get", "--print-value-only", leader_key(url.prefix).decode()).stdout.decode().strip()
            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while loser.election.leader_id != winner.election.name:  # it read the key after losing
                assert asyncio.get_running_loop().time() < deadline, loser.election.leader_id
                await asyncio.sleep(0.05)  # polling the loser's state, bounded
            first = (winner.election.name, loser.election.leader, loser.events[:], held)
            await winner.election.close()  # revokes its lease: the key goes at once
            await loser.wait_for(1, "elected")
            return first, winner.events, loser.election.leader, loser.election.leader_id
        finally:
            await a.election.close()
            await b.election.close()

    (winner, loser_leader, loser_events, held), winner_events, now_leader, now_id = asyncio.run(scenario())
    assert held == winner  # the key's value names the one that won, and only one won
    assert loser_leader is False and loser_events == []
    assert winner_events == ["elected", "deposed"]  # closing stopped its controller
    assert now_leader is True and now_id != winner


def test_a_leader_past_half_its_ttl_without_a_refresh_is_deposed_at_once(etcd):
    url = parse_registry_url(etcd.url("/elect2"))
    skew = [0.0]

    async def scenario():
        a = Candidate(url, "router-a", clock=lambda: time.monotonic() + skew[0])
        b = Candidate(url, "router-b")
        try:
            a.election.start()
            await a.wait_for(1, "elected")
            b.election.start()
            skew[0] = TTL_S * DEPOSED_AFTER + 0.01  # as if a had been frozen that long since its last refresh
            not_leader_at_once = a.election.leader is False
            await a.wait_for(1, "deposed")  # stopped its controller, freed the key, campaigns again
            await asyncio.wait(
                [asyncio.create_task(c.wait_for(n, "elected")) for c, n in ((a, 2), (b, 1))],
                timeout=TIMEOUT_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
            return not_leader_at_once, [a.election.leader, b.election.leader]
        finally:
            await a.election.close()
            await b.election.close()

    not_leader_at_once, leaders = asyncio.run(scenario())
    assert not_leader_at_once
    assert leaders.count(True) == 1, leaders


def test_a_forged_leader_key_is_deleted_and_a_campaigner_is_elected_within_the_ttl(etcd):
    """A key no campaign wrote: without a lease (it would outlive every router), or naming a
    campaigner under a lease not its own (only that campaigner can tell)."""
    url = parse_registry_url(etcd.url("/elect5"))
    key = leader_key(url.prefix).decode()
    forger = int(json.loads(etcd.ctl("lease", "grant", "60", "--write-out=json").stdout)["ID"])

    async def elected_after(name: str, *forge: str) -> float:
        etcd.ctl("put", *forge, key, "--", name if forge else "router-nowhere")
        candidate = Candidate(url, name)
        start = time.monotonic()
        try:
            candidate.election.start()
            await asyncio.wait_for(candidate.wait_for(1, "elected"), TAKEOVER_BOUND_S)
            return time.monotonic() - start
        finally:
            await candidate.election.close()

    no_lease_s = asyncio.run(elected_after("router-a"))
    named_s = asyncio.run(elected_after("router-b", f"--lease={forger:x}"))
    etcd.ctl("lease", "revoke", f"{forger:x}")
    print(f"forged leader key: elected {no_lease_s:.2f} s (no lease) and {named_s:.2f} s (naming it) after")


# ---- two router processes ----------------------------------------------------------------
def start_router(etcd, prefix: str) -> Process:
    return Process(
        ["--role", "router", "--port", "0", "--http-port", "0", "--registry", etcd.url(prefix),
         "--registry-ttl-s", str(TTL_S), "--ratio-controller", "--controller-interval-s", "0.2"],
        SECRET,
    )  # fmt: skip


def controller_state(router: Process) -> dict:
    with urllib.request.urlopen(f"{router.http_url}/admin/controller", timeout=10) as response:
        return json.loads(response.read())


def leader_gauge(router: Process) -> float:
    with urllib.request.urlopen(f"{router.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("minipd_controller_leader ")))


def leaders(routers: list[Process]) -> list[Process]:
    """The routers reporting leadership now; asserts that at most one does."""
    found = [r for r in routers if controller_state(r)["leader"]]
    assert len(found) <= 1, "two routers report leading the controller"
    return found


def test_two_routers_one_leader_and_a_killed_leader_is_replaced_within_the_ttl(etcd):
    routers = [start_router(etcd, "/elect3"), start_router(etcd, "/elect3")]
    try:
        (leader,) = wait_until(lambda: leaders(routers), TIMEOUT_S, "one router elected")
        (follower,) = [r for r in routers if r is not leader]
        state = wait_until(
            lambda: (s := controller_state(leader))["last_decision"] is not None and s, TIMEOUT_S, "a decision"
        )
        other = wait_until(
            lambda: (s := controller_state(follower))["leader_id"] is not None and s, TIMEOUT_S, "the leader seen"
        )
        assert state["on"] and state["leader"]  # it decides
        assert not other["on"] and other["last_decision"] is None  # it does not
        assert other["leader_id"] == state["leader_id"] and state["leader_id"].endswith(f"-{leader.popen.pid}")
        assert (leader_gauge(leader), leader_gauge(follower)) == (1.0, 0.0)

        killed = time.monotonic()
        leader.popen.kill()
        leader.popen.wait(30)
        wait_until(lambda: controller_state(follower)["leader"], TAKEOVER_BOUND_S + 2.0, "the follower took over")
        takeover_s = time.monotonic() - killed
        assert takeover_s <= TAKEOVER_BOUND_S, takeover_s
        assert controller_state(follower)["on"] and leader_gauge(follower) == 1.0
        print(f"a killed leader replaced in {takeover_s:.2f} s (TTL {TTL_S} s)")
    finally:
        for router in routers:
            router.stop()


def test_a_frozen_leader_is_replaced_and_once_resumed_is_not_leader(etcd):
    routers = [start_router(etcd, "/elect4"), start_router(etcd, "/elect4")]
    try:
        (leader,) = wait_until(lambda: leaders(routers), TIMEOUT_S, "one router elected")
        (follower,) = [r for r in routers if r is not leader]
        wait_until(lambda: controller_state(leader)["last_decision"], TIMEOUT_S, "the leader decides")
        frozen, frozen_wall = time.monotonic(), time.time()
        os.kill(leader.popen.pid, signal.SIGSTOP)  # its connections stay open: only its lease can tell
        wait_until(lambda: controller_state(follower)["leader"], TAKEOVER_BOUND_S + 2.0, "the follower took over")
        takeover_s = time.monotonic() - frozen
        wait_until(lambda: time.monotonic() - frozen > TTL_S + 1.0, TTL_S + 2.0, "frozen for longer than the TTL")
        os.kill(leader.popen.pid, signal.SIGCONT)
        first = controller_state(leader)  # its first answer after running again
        assert first["leader"] is False, first
        # no decision since it resumed (its controller, if not stopped yet, is held by the guard)
        assert first["last_decision"] is None or first["last_decision"]["decided_at"] < frozen_wall, first
        assert leader_gauge(leader) == 0.0
        wait_until(lambda: not controller_state(leader)["on"], TIMEOUT_S, "the old leader's controller stopped")
        new_leader = controller_state(follower)["leader_id"]
        resumed = wait_until(  # it campaigned again, lost, and names the new leader
            lambda: (s := controller_state(leader))["leader_id"] == new_leader and s, TIMEOUT_S, "the new leader seen"
        )
        assert resumed["moves"] == []  # it moved nothing meanwhile
        for _ in range(10):  # and leadership stays with the new one
            assert leaders(routers) == [follower]
        assert takeover_s <= TAKEOVER_BOUND_S, takeover_s
        print(f"a frozen leader replaced in {takeover_s:.2f} s (TTL {TTL_S} s)")
    finally:
        for router in routers:
            router.stop()
