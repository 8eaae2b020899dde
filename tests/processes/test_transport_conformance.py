"""The conformance suite every transport backend passes: cross-process for tcp, ucx and nixl,
in-process for loopback. This process plays one side (usually the receiver), a `Peer` the
other; byte patterns are pure functions of seeds, so each side can check the other's work.
Every transport here shares a cluster secret (as the cluster launcher's always do), and a
peer with another secret must not land a byte.

Length: one contract, one file: the `Transport` docstrings' promises, each a test run against
every backend, so that a new backend is checked by reading down one list."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sys

import pytest
import torch
import uvloop
from transport_peer import NUM_LAYERS, START_TIMEOUT_S, Peer, make_pool

from minipd.transports.backends import BACKENDS, create_transport
from minipd.transports.loopback_hub import LoopbackHub
from minipd.transports.shared_secret import SharedSecret
from minipd.transports.transfer_error import TransferError

NUM_BLOCKS = 256  # 4 layers x 256 blocks x 8 KiB = 8 MiB per pool
MAIN_SEED, PEER_SEED, LIMITED_SEED = 1, 2, 3
MAIN_ID, PEER_ID = "decode-main", "prefill-peer"
LANDED_TIMEOUT_S = 20.0
# A killed peer must be noticed well before this.
FAILURE_BOUND_S = 10.0
LINK_GBPS = 0.4
LIMIT_TOLERANCE = 0.10
# Backends that notice a dead peer themselves; the others rely on the control plane.
SELF_DETECTING = {"tcp"}
SECRET = SharedSecret(b"the conformance suite's cluster secret")
WRONG_SECRET = SharedSecret(b"a secret of some other cluster")
# How long a header that does not prove the secret is given to land anyway.
FORGED_WAIT_S = 2.0


def _installed(backend: str) -> bool:
    return all(importlib.util.find_spec(p) is not None for p in BACKENDS[backend].packages)


BACKEND_PARAMS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            not _installed(name),
            reason=(
                f"transport {name!r} needs the {BACKENDS[name].extra} extra: pip install -e '.[{BACKENDS[name].extra}]'"
            ),
        ),
    )
    for name in BACKENDS
]


class Env:
    """One backend's fixtures: a loop, our transport, a connected peer (both directions)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.loop = uvloop.new_event_loop()
        self.hub = LoopbackHub()
        self.options = {"hub": self.hub, "secret": SECRET} if backend == "loopback" else {"secret": SECRET}
        self.pool = make_pool(NUM_BLOCKS, MAIN_SEED)
        self.original = self.pool.clone()
        self.transport = create_transport(backend, self.pool, instance_id=MAIN_ID, **self.options)
        self.peers: list[Peer] = []
        self.run(self.transport.start())
        self.peer = self.add_peer(PEER_ID, PEER_SEED)

    def run(self, coro, timeout: float = START_TIMEOUT_S):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def add_peer(self, instance_id: str, seed: int, **options) -> Peer:
        """Start a peer and connect it to us and us to it."""
        on_lost = (
            None
            if self.backend in SELF_DETECTING
            else (lambda peer_id: self.transport.peer_lost(peer_id, "control plane: peer process died"))
        )
        peer = Peer(self.backend, instance_id, NUM_BLOCKS, seed, on_lost=on_lost, **{**self.options, **options})
        peer.attach(self.loop)
        self.peers.append(peer)

        async def connect() -> None:
            description = await peer.call("start", timeout=START_TIMEOUT_S)
            assert await self.transport.connect(description) == instance_id
            assert await peer.call("connect", description=self.transport.describe()) == MAIN_ID

        self.run(connect())
        return peer

    def close(self) -> None:
        for peer in self.peers:
            peer.stop()
        self.run(self.transport.close())
        self.loop.close()


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def env(request):
    env = Env(request.param)
    yield env
    env.close()


def random_block_map(rng: random.Random, num_blocks: int, free: list[int]) -> tuple[list[int], list[int]]:
    """`num_blocks` source blocks -> destination blocks taken from `free`, mixing contiguous
    stretches (which coalesce) with scattered single blocks."""
    src = rng.sample(range(NUM_BLOCKS), num_blocks)
    src.sort()
    dst: list[int] = []
    while len(dst) < num_blocks:
        stretch = min(rng.choice([1, 1, 3, 8, 16]), num_blocks - len(dst))
        start = free[0]
        if all(start + i in free for i in range(stretch)):
            picked = [start + i for i in range(stretch)]
        else:
            picked = [free[0]]
        for block in picked:
            free.remove(block)
        dst.extend(picked)
    return src, dst


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte-exact equality (the pools hold random bytes, so float compare would trip on NaNs)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def expected_blocks(seed: int, block_ids: list[int]) -> torch.Tensor:
    return make_pool(NUM_BLOCKS, seed)[:, block_ids]


def assert_only_reserved_changed(env: Env, reserved: set[int]) -> None:
    untouched = [b for b in range(NUM_BLOCKS) if b not in reserved]
    assert same_bytes(env.pool[:, untouched], env.original[:, untouched]), "a block outside the reservations changed"


async def _wait_polled(transport, request_ids: set[str], timeout: float):
    """Poll until every request in `request_ids` is reported; returns their outcomes."""
    outcomes = {}
    deadline = asyncio.get_running_loop().time() + timeout
    while set(outcomes) != request_ids:
        for outcome in transport.poll_landed():
            assert outcome.request_id not in outcomes, "a request was reported twice"
            outcomes[outcome.request_id] = outcome
        assert asyncio.get_running_loop().time() < deadline, f"not reported: {request_ids - set(outcomes)}"
        await asyncio.sleep(0.005)  # poll cadence of an engine loop, not synchronisation
    return outcomes


@pytest.mark.timeout(120)
def test_random_maps_land_byte_exact_and_once(env: Env) -> None:
    rng = random.Random(7)
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    free.sort(key=lambda b: (b // 32 * 7919) % NUM_BLOCKS)  # scatter the free list in chunks
    requests = {f"maps-{i}": random_block_map(rng, count, free) for i, count in enumerate([40, 1, 64])}
    awaited = "maps-0"

    async def scenario():
        for request_id, (_, dst) in requests.items():
            env.transport.expect(request_id, PEER_ID, dst)
        sends = [
            asyncio.ensure_future(
                env.peer.call(
                    "send",
                    request_id=request_id,
                    peer_id=MAIN_ID,
                    src_ids=src,
                    dst_ids=dst,
                    layers=list(range(NUM_LAYERS)),
                )
            )
            for request_id, (src, dst) in requests.items()
        ]
        landed = await env.transport.wait_landed(awaited, timeout=LANDED_TIMEOUT_S)
        polled = await _wait_polled(env.transport, set(requests) - {awaited}, LANDED_TIMEOUT_S)
        results = await asyncio.gather(*sends)
        return landed, polled, results

    landed, polled, results = env.run(scenario())
    block_bytes = env.transport.layout.block_bytes
    assert landed.num_bytes == NUM_LAYERS * len(requests[awaited][1]) * block_bytes
    for request_id, outcome in polled.items():
        assert (
            outcome.error is None
            and outcome.landed.num_bytes == NUM_LAYERS * len(requests[request_id][1]) * block_bytes
        )
    assert all(r["num_bytes"] is not None for r in results)
    for src, dst in requests.values():
        assert same_bytes(env.pool[:, dst], expected_blocks(PEER_SEED, src)), "destination bytes differ"
    assert_only_reserved_changed(env, {b for _, dst in requests.values() for b in dst})
    # Each outcome was reported exactly once: nothing more to poll, nothing more to await.
    assert env.transport.poll_landed() == []
    with pytest.raises(TransferError):
        env.run(env.transport.wait_landed(awaited, timeout=1))
    env.original.copy_(env.pool)


def _idle_sleep(transport) -> asyncio.Future | None:
    """What a polling backend's receiver sleeps on between polls (None: event-driven backend)."""
    if transport.backend == "ucx":
        return transport._progress._sleep.current
    if transport.backend == "nixl":
        return transport._idle.current
    return None


async def _until_idle_sleep_other_than(transport, seen: asyncio.Future | None) -> None:
    """Return once the receiver sleeps on a poll sleep other than `seen` (taken while the loop
    was stopped, before IDLE_POLL_S changed: the new one read the new value)."""
    while _idle_sleep(transport) is None or _idle_sleep(transport) is seen or _idle_sleep(transport).done():
        await asyncio.sleep(0.001)  # condition poll, bounded by the caller's timeout


@pytest.mark.timeout(120)
def test_idle_receiver_wakes_when_a_request_is_expected(env: Env, monkeypatch) -> None:
    """With nothing expected, a polling receiver polls rarely (IDLE_POLL_S); `expect` must cut
    that sleep short, or a transfer's start waits out the idle poll. With an idle poll of an
    hour, the request lands within the timeout only if `expect` woke the receiver."""
    module = sys.modules[type(env.transport).__module__]
    if hasattr(module, "IDLE_POLL_S"):
        seen = _idle_sleep(env.transport)
        monkeypatch.setattr(module, "IDLE_POLL_S", 3600.0)
        env.run(_until_idle_sleep_other_than(env.transport, seen), timeout=LANDED_TIMEOUT_S)
    src, dst = list(range(16, 24)), list(range(120, 128))

    async def scenario():
        env.transport.expect("after-idle", PEER_ID, dst)
        await env.peer.call(
            "send", request_id="after-idle", peer_id=MAIN_ID, src_ids=src, dst_ids=dst, layers=list(range(NUM_LAYERS))
        )
        return await env.transport.wait_landed("after-idle", timeout=LANDED_TIMEOUT_S)

    landed = env.run(scenario())
    assert landed.num_bytes == NUM_LAYERS * len(dst) * env.transport.layout.block_bytes
    assert same_bytes(env.pool[:, dst], expected_blocks(PEER_SEED, src))
    assert_only_reserved_changed(env, set(dst))
    env.original.copy_(env.pool)


@pytest.mark.timeout(120)
def test_abort_midway_reports_nothing_and_drops_late_data(env: Env) -> None:
    src, dst = list(range(100, 132)), list(range(200, 232))
    follow_src, follow_dst = list(range(0, 8)), list(range(240, 248))

    async def scenario():
        env.transport.expect("abort-me", PEER_ID, dst)
        await env.peer.call(
            "send", request_id="abort-me", peer_id=MAIN_ID, src_ids=src, dst_ids=dst, layers=[0, 1], finish=False
        )
        # abort on our side while the sender goes on with the remaining layers and finishes
        aborted, rest = await asyncio.gather(
            env.transport.abort("abort-me"),
            env.peer.call("send", request_id="abort-me", peer_id=MAIN_ID, src_ids=src, dst_ids=dst, layers=[2, 3]),
        )
        again = await env.transport.abort("abort-me")
        # a later request on the same link proves the late data and the finish were processed
        env.transport.expect("after-abort", PEER_ID, follow_dst)
        await env.peer.call(
            "send",
            request_id="after-abort",
            peer_id=MAIN_ID,
            src_ids=follow_src,
            dst_ids=follow_dst,
            layers=list(range(NUM_LAYERS)),
        )
        landed = await env.transport.wait_landed("after-abort", timeout=LANDED_TIMEOUT_S)
        return aborted, again, landed

    aborted, again, landed = env.run(scenario())
    assert aborted is True and again is False
    assert landed.request_id == "after-abort"
    assert env.transport.poll_landed() == [], "an aborted request was reported"
    with pytest.raises(TransferError):
        env.run(env.transport.wait_landed("abort-me", timeout=1))
    assert same_bytes(env.pool[:, follow_dst], expected_blocks(PEER_SEED, follow_src))
    if not env.transport.one_sided:
        # layers sent after the abort never reached the freed blocks
        assert same_bytes(env.pool[2:, dst], env.original[2:, dst]), "late data landed after abort"
    assert_only_reserved_changed(env, set(dst) | set(follow_dst))
    env.original.copy_(env.pool)


@pytest.mark.timeout(120)
def test_link_limit_honoured_then_sender_killed_midway(env: Env) -> None:
    limited = env.add_peer("limited-sender", LIMITED_SEED, link_gbps=LINK_GBPS)
    blocks = list(range(NUM_BLOCKS))

    async def measure():
        env.transport.expect("limited", "limited-sender", blocks)
        result = await limited.call(
            "send",
            request_id="limited",
            peer_id=MAIN_ID,
            src_ids=blocks,
            dst_ids=blocks,
            layers=list(range(NUM_LAYERS)),
        )
        await env.transport.wait_landed("limited", timeout=LANDED_TIMEOUT_S)
        return result

    result = env.run(measure())
    gbps = result["num_bytes"] * 8 / result["elapsed_s"] / 1e9
    assert abs(gbps - LINK_GBPS) <= LIMIT_TOLERANCE * LINK_GBPS, f"{gbps:.3f} Gbit/s under a {LINK_GBPS} limit"
    assert same_bytes(env.pool, make_pool(NUM_BLOCKS, LIMITED_SEED))
    env.original.copy_(env.pool)

    reserved = list(range(64, 192))

    async def killed():
        env.transport.expect("killed", "limited-sender", reserved)
        progress = asyncio.Queue()
        send = asyncio.ensure_future(
            limited.call(
                "send",
                request_id="killed",
                peer_id=MAIN_ID,
                src_ids=reserved,
                dst_ids=reserved,
                layers=list(range(NUM_LAYERS)),
                report_first_write=True,
                progress=progress,
            )
        )
        await progress.get()  # one layer landed; the limit keeps the rest in flight
        limited.kill()
        started = asyncio.get_running_loop().time()
        with pytest.raises(TransferError) as failure:
            await env.transport.wait_landed("killed", timeout=FAILURE_BOUND_S)
        send.cancel()
        return failure.value, asyncio.get_running_loop().time() - started

    error, waited = env.run(killed())
    assert error.peer_id == "limited-sender" and error.request_id == "killed"
    assert "within" not in error.reason, f"only the timeout caught the dead peer: {error}"
    assert waited < FAILURE_BOUND_S
    assert_only_reserved_changed(env, set(reserved))
    env.original.copy_(env.pool)


@pytest.mark.timeout(120)
def test_receiver_killed_midway_fails_the_sender(env: Env) -> None:
    victim = env.add_peer("victim-receiver", PEER_SEED)
    blocks = list(range(NUM_BLOCKS))
    from minipd.transports.block_run import coalesce_runs

    runs = coalesce_runs(blocks, blocks)
    before = env.pool.clone()

    async def scenario():
        await victim.call("expect", request_id="to-victim", peer_id=MAIN_ID, dst_ids=blocks)
        first = env.transport.write_layer("victim-receiver", "to-victim", 0, runs)
        await first
        victim.kill()
        started = asyncio.get_running_loop().time()
        with pytest.raises(TransferError) as failure:
            # keep writing until the loss is noticed, as a prefill would layer by layer
            for _ in range(1000):
                for layer in range(NUM_LAYERS):
                    await env.transport.write_layer("victim-receiver", "to-victim", layer, runs)
            await env.transport.finish_request("victim-receiver", "to-victim")
        return failure.value, asyncio.get_running_loop().time() - started

    error, waited = env.run(scenario(), timeout=FAILURE_BOUND_S * 2)
    assert error.peer_id == "victim-receiver" and error.request_id == "to-victim"
    assert waited < FAILURE_BOUND_S
    assert same_bytes(env.pool, before), "the sender's pool changed"


@pytest.mark.timeout(120)
def test_a_sender_with_another_secret_lands_nothing(env: Env) -> None:
    """tcp refuses the link itself; ucx drops its headers before posting a receive; a nixl
    WRITE is one-sided and lands (what only the metadata's secrecy prevents), but its
    notifications are ignored, so the request never counts as landed. A cluster member's
    transfer right after is unaffected."""
    if env.backend == "loopback":
        pytest.skip("loopback peers share one process: there is no link to authenticate")
    intruder = Peer(env.backend, "intruder", NUM_BLOCKS, LIMITED_SEED, secret=WRONG_SECRET)
    intruder.attach(env.loop)
    env.peers.append(intruder)
    forged_blocks, legit_blocks = list(range(10, 20)), list(range(40, 50))

    async def scenario():
        await intruder.call("start", timeout=START_TIMEOUT_S)
        env.transport.expect("forged", "intruder", forged_blocks)
        connect_error, send = None, None
        try:
            await intruder.call("connect", description=env.transport.describe())
        except TransferError as exc:
            connect_error = exc.reason
        else:  # a connectionless backend: the writes go out, unauthenticated
            send = asyncio.ensure_future(
                intruder.call(
                    "send",
                    request_id="forged",
                    peer_id=MAIN_ID,
                    src_ids=forged_blocks,
                    dst_ids=forged_blocks,
                    layers=list(range(NUM_LAYERS)),
                    timeout=2 * FORGED_WAIT_S,
                )
            )
        with pytest.raises(TransferError) as never_landed:
            await env.transport.wait_landed("forged", timeout=FORGED_WAIT_S)
        if send is not None:
            await asyncio.gather(send, return_exceptions=True)
        env.transport.peer_lost("intruder", "not a member of this cluster")
        failed = await _wait_polled(env.transport, {"forged"}, LANDED_TIMEOUT_S)
        env.transport.expect("legit", PEER_ID, legit_blocks)
        await env.peer.call(
            "send",
            request_id="legit",
            peer_id=MAIN_ID,
            src_ids=legit_blocks,
            dst_ids=legit_blocks,
            layers=list(range(NUM_LAYERS)),
        )
        landed = await env.transport.wait_landed("legit", timeout=LANDED_TIMEOUT_S)
        return connect_error, never_landed.value, failed["forged"], landed

    connect_error, never_landed, failed, landed = env.run(scenario())
    if env.backend == "tcp":
        assert connect_error is not None and "refused the KV link" in connect_error and "secret" in connect_error
    assert "within" in never_landed.reason, "the forged transfer must not count as landed"
    assert failed.error is not None and failed.landed is None
    assert landed.num_bytes == NUM_LAYERS * len(legit_blocks) * env.transport.layout.block_bytes
    assert same_bytes(env.pool[:, legit_blocks], expected_blocks(PEER_SEED, legit_blocks))
    writable = set(forged_blocks) if env.transport.one_sided else set()
    assert_only_reserved_changed(env, writable | set(legit_blocks))
    env.original.copy_(env.pool)
