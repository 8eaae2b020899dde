"""The registry's pieces against a real etcd (started once for the module): role-switch
claims (exactly one of two concurrent claims wins; a stale epoch is refused), a router's
membership ignoring malformed values with a log line, and the watch resuming from the last
revision seen after etcd restarts."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest
from etcd_server import etcd_fixture, needs_etcd  # noqa: F401 (the fixture `etcd`)

from minipd.control.messages import Fingerprint
from minipd.control.role import Role
from minipd.engine.model_loader import load_tokenizer_only
from minipd.ops.registry.epoch_cas import EtcdSwitchClaims
from minipd.ops.registry.etcd_client import EtcdEndpoints
from minipd.ops.registry.etcd_url import parse_registry_url
from minipd.ops.registry.records import InstanceRecord, RegistryKeys, TransportInfo, encode
from minipd.ops.registry.router_membership import EtcdRouterMembership
from minipd.ops.registry.session import LeaseSession
from minipd.ops.registry.watcher import PrefixWatcher
from minipd.router.role_switch_driver import SwitchConflict
from minipd.router.router import Router

pytestmark = needs_etcd
TIMEOUT_S = 20.0


def record(instance_id: str, epoch: int, port: int = 9) -> InstanceRecord:
    from minipd.models.arch.model_config import PRESETS

    return InstanceRecord(
        instance_id=instance_id,
        host="127.0.0.1",
        port=port,
        role=Role.DECODE,
        epoch=epoch,
        fingerprint=Fingerprint(3, PRESETS["tiny"], "digest", "float32", 16, "layout"),
        compute="host/cpu:0",
        transport=TransportInfo("tcp", b"\x00\x01"),
        start_nonce=b"\x07" * 32,
    )


async def _claimant(url, name: str) -> tuple[EtcdSwitchClaims, LeaseSession]:
    async def no_keys(lease_id: int) -> None:
        pass

    endpoints = EtcdEndpoints(url)
    session = LeaseSession(endpoints, 5, no_keys, name)
    await session.start(TIMEOUT_S)
    return EtcdSwitchClaims(endpoints, RegistryKeys(url.prefix), session, name), session


def test_two_concurrent_claims_on_one_epoch_exactly_one_wins(etcd):
    url = parse_registry_url(etcd.url("/claims"))
    keys = RegistryKeys(url.prefix)

    async def scenario():
        a, session_a = await _claimant(url, "router-a")
        b, session_b = await _claimant(url, "router-b")
        try:
            await a.endpoints.client.put(keys.instance("decode-0"), encode(record("decode-0", 0)))
            entered = asyncio.Event()
            leave = asyncio.Event()

            async def switch(claims: EtcdSwitchClaims) -> str:
                async with claims.claim("decode-0", 0, Role.PREFILL):
                    entered.set()
                    await asyncio.wait_for(leave.wait(), TIMEOUT_S)
                return claims.router_name

            tasks = [asyncio.create_task(switch(c)) for c in (a, b)]
            await asyncio.wait_for(entered.wait(), TIMEOUT_S)
            claim_held = etcd.keys("/claims/switches/")
            leave.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            # the instance took epoch 1 and published it: a claim from epoch 0 is stale now
            await a.endpoints.client.put(keys.instance("decode-0"), encode(record("decode-0", 1)))
            with pytest.raises(SwitchConflict, match="role epoch 1 in the registry, not 0"):
                async with b.claim("decode-0", 0, Role.PREFILL):
                    pass
            async with b.claim("decode-0", 1, Role.PREFILL):  # the current epoch: granted
                pass
            return claim_held, results
        finally:
            await a.close()
            await session_a.close()
            await b.close()
            await session_b.close()

    claim_held, results = asyncio.run(scenario())
    won = [r for r in results if isinstance(r, str)]
    lost = [r for r in results if isinstance(r, SwitchConflict)]
    assert len(won) == 1 and len(lost) == 1, results
    assert f"being switched by router {won[0]!r}" in str(lost[0])
    assert claim_held == ["/claims/switches/decode-0"]
    assert etcd.keys("/claims/switches/") == []  # released once the switch ended


def test_malformed_values_are_logged_and_ignored(etcd, caplog):
    url = parse_registry_url(etcd.url("/malformed"))
    router = Router(load_tokenizer_only("tiny"))
    bad = {
        "/malformed/instances/junk": b"not json at all",
        "/malformed/instances/typed": b'{"instance_id": "typed", "port": "eighty"}',
        "/malformed/instances/other": encode(record("someone-else", 0)),
        "/malformed/instances/port": encode(msgspec.structs.replace(record("port", 0), port=70000)),
        "/malformed/switches/junk": b"[1, 2",
    }

    async def scenario():
        membership = EtcdRouterMembership(router, url, 5)
        await membership.start(TIMEOUT_S)
        try:
            for key, value in bad.items():
                etcd.ctl("put", key, "--", value.decode())
            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while membership.num_ignored < len(bad):
                assert asyncio.get_running_loop().time() < deadline, membership.num_ignored
                await asyncio.sleep(0.05)  # the watch delivers them within milliseconds
            return dict(membership.records), dict(membership.switch_claims)
        finally:
            await membership.close()
            await router.close()

    with caplog.at_level(logging.WARNING, logger="minipd.ops.registry.router_membership"):
        records, claims = asyncio.run(scenario())
    assert records == {} and claims == {}
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for key in bad:
        assert f"ignoring the value of {key}" in logged
    assert "port: 70000 is not in 1-65535" in logged
    assert "'someone-else' under the key of 'other'" in logged


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, bytes]] = []
        self.changed = asyncio.Event()

    def snapshot(self, items):
        self.events.append(("snapshot", b",".join(e.key for e in items)))
        self.changed.set()

    def put(self, entry):
        self.events.append(("put", entry.key))
        self.changed.set()

    def delete(self, key):
        self.events.append(("delete", key))
        self.changed.set()


def test_the_watch_resumes_from_the_last_revision_after_an_etcd_restart(etcd):
    url = parse_registry_url(etcd.url("/resume"))

    async def wait_for(recorder: Recorder, event) -> None:
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S
        while event not in recorder.events:
            recorder.changed.clear()
            await asyncio.wait_for(recorder.changed.wait(), deadline - asyncio.get_running_loop().time())

    async def scenario():
        recorder = Recorder()
        watcher = PrefixWatcher(EtcdEndpoints(url), b"/resume/", recorder)
        etcd.ctl("put", "/resume/a", "1")
        await watcher.start(TIMEOUT_S)
        try:
            etcd.ctl("put", "/resume/b", "2")
            await wait_for(recorder, ("put", b"/resume/b"))
            await asyncio.get_running_loop().run_in_executor(None, etcd.stop)
            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while watcher.connected.is_set():  # the watch saw the outage
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)  # polling the watcher's state, bounded
            await asyncio.get_running_loop().run_in_executor(None, etcd.start)
            etcd.ctl("put", "/resume/c", "3")
            etcd.ctl("del", "/resume/a")
            await wait_for(recorder, ("delete", b"/resume/a"))
            return recorder.events, watcher.num_watches
        finally:
            await watcher.close()

    events, num_watches = asyncio.run(scenario())
    assert events == [
        ("snapshot", b"/resume/a"),
        ("put", b"/resume/b"),
        ("put", b"/resume/c"),
        ("delete", b"/resume/a"),
    ]
    assert num_watches >= 2  # created again after the restart, from the revision after /resume/b's


def test_a_short_lease_outlives_a_10s_etcd_outage(etcd):
    """etcd gives every lease a full TTL when it returns; the refresh must reach it within that
    TTL (gRPC's own reconnect backoff, grown over the outage, must not delay it past it)."""
    url = parse_registry_url(etcd.url("/outage"))
    ttl_s = 2

    async def scenario():
        endpoints = EtcdEndpoints(url)

        async def put(lease_id: int) -> None:
            await endpoints.client.put(b"/outage/me", b"1", lease_id)

        session = LeaseSession(endpoints, ttl_s, put, "outage")
        await session.start(TIMEOUT_S)
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, etcd.stop)
            stopped = loop.time()
            while loop.time() - stopped < 10.0:  # the outage: the session keeps failing its refreshes
                await asyncio.sleep(0.2)  # the outage's length is the scenario (5 TTLs), not a wait for an event
            await loop.run_in_executor(None, etcd.start)
            back = loop.time()
            present = []
            while loop.time() - back < 3 * ttl_s:  # past the TTL etcd granted on its return
                present.append(bool(etcd.keys("/outage/")))
                await asyncio.sleep(0.1)  # sampling the key over the TTL: it must never be missing
            return present, session.num_leases
        finally:
            await session.close()

    present, num_leases = asyncio.run(scenario())
    assert all(present), present
    assert num_leases == 1  # never expired: no new lease needed
