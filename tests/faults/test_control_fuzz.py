"""Fuzzing the control plane (hypothesis): random bytes, mutated frames, and valid frames in
the wrong order or from the wrong role, sent to the prefill and decode instances of a
secured cluster, unauthenticated and after a real handshake, while other users' requests run.

Invariants: no instance stops serving, every block comes back once the fuzzing connection
is gone, and the concurrent requests finish with exactly the tokens an unattacked engine
produces. An authenticated router is trusted with its own requests only, so the fuzzer uses
request ids and peer names of its own (aborting another router's request or declaring a
live peer lost is its right, not an attack).
"""

from __future__ import annotations

import asyncio
import struct

import msgspec
import pytest
from engine_helpers import complete
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tcp_cluster import CONFIG, LOCALHOST, SECRET, TcpCluster

from minipd.control.handshake import client_proof
from minipd.control.messages import (
    PROTOCOL_VERSION,
    Abort,
    AnyMessage,
    Challenge,
    ClientGenerate,
    Decode,
    Generate,
    GetStats,
    Hello,
    PeerLost,
    Prefill,
    Prove,
    Register,
    Renew,
    Reserve,
    Stats,
    Welcome,
)
from minipd.control.role import Role
from minipd.engine.sampling_params import SamplingParams
from minipd.transports.shared_secret import new_nonce

HEADER = struct.Struct(">I")
TIMEOUT_S = 10.0
START_TIMEOUT_S = 180.0
QUIET_S = 0.02  # after its frames, a fuzz connection lingers this long for answers, then closes
SETTLE_S = 10.0
MAX_EXAMPLES = 60
USER_PROMPT = list(range(3, 43))  # disaggregated: longer than the local-prefill threshold
# seeded, so the router draws no seed from `random` while hypothesis draws examples
USER_PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, seed=1)

request_ids = st.sampled_from(["f0", "f1", "f2", ""])
token_lists = st.lists(st.integers(-3, 300), max_size=40) | st.just(list(range(40)))
sampling = st.builds(
    SamplingParams,
    max_tokens=st.integers(-1, 8),
    temperature=st.sampled_from([0.0, 0.7, -1.0]),
    top_p=st.sampled_from([1.0, 0.5, 0.0]),
    top_k=st.integers(-1, 5),
    ignore_eos=st.booleans(),
)
calls = st.integers(0, 2**32)

MESSAGES = st.one_of(
    st.builds(
        Hello,
        protocol_version=st.sampled_from([PROTOCOL_VERSION, 1, 99]),
        role=st.sampled_from(list(Role)),
        nonce=st.binary(max_size=40),
        call_id=calls,
        request_id=request_ids,
    ),
    st.builds(Prove, proof=st.binary(max_size=40), call_id=calls),
    st.builds(Challenge, nonce=st.binary(max_size=40), call_id=calls),
    st.builds(
        Reserve,
        token_ids=token_lists,
        prefill_instance=st.sampled_from(["fuzz-prefill", "prefill-0"]),
        call_id=calls,
        request_id=request_ids,
    ),
    # a decode instance of its own: the prefill instance's link to decode-0 belongs to the router
    st.builds(
        Prefill,
        token_ids=token_lists,
        sampling=sampling,
        decode_instance=st.just("fuzz-decode"),
        decode_description=st.binary(max_size=64),
        decode_fingerprint=st.deferred(lambda: st.just(FINGERPRINT[0])),
        dst_block_ids=st.lists(st.integers(-2, 70), max_size=5),
        num_skip_blocks=st.integers(-1, 3),
        call_id=calls,
        request_id=request_ids,
    ),
    st.builds(Decode, first_token=st.integers(-1, 300), sampling=sampling, request_id=request_ids),
    st.builds(Generate, token_ids=token_lists, sampling=sampling, request_id=request_ids),
    st.builds(Renew, request_id=request_ids),
    st.builds(Abort, request_id=request_ids),
    st.builds(PeerLost, instance_id=st.just("fuzz-prefill"), reason=st.text(max_size=10), request_id=request_ids),
    st.builds(GetStats, settle=st.just(False), call_id=calls),
    st.builds(Register, host=st.just(LOCALHOST), port=st.integers(1, 65535), call_id=calls),
    st.builds(ClientGenerate, token_ids=st.one_of(st.none(), token_lists), request_id=request_ids),
    st.builds(Welcome, instance_id=st.text(max_size=8), role=st.sampled_from(list(Role)), call_id=calls),
    st.builds(
        Stats,
        instance_id=st.just("x"),
        role=st.just(Role.DECODE),
        num_running=st.integers(0, 3),
        num_waiting=st.just(0),
        num_free_blocks=st.just(0),
        num_used_blocks=st.just(0),
        num_cached_blocks=st.just(0),
        num_blocks=st.just(0),
        call_id=calls,
    ),
)
FINGERPRINT: list = []  # the cluster's, filled in by the fixture (Prefill needs a real one)


def _frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


@st.composite
def mutated(draw) -> bytes:
    """A valid frame with bytes flipped, cut, inserted, or its length prefix changed."""
    frame = bytearray(_frame(msgspec.msgpack.encode(draw(MESSAGES))))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "length"]))
        at = draw(st.integers(0, len(frame) - 1))
        if kind == "flip":
            frame[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del frame[at:]
        elif kind == "insert":
            frame[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            frame[: HEADER.size] = HEADER.pack(draw(st.integers(0, 2**32 - 1)))
        if not frame:
            frame = bytearray(b"\0")
    return bytes(frame)


FRAMES = st.one_of(MESSAGES.map(lambda m: _frame(msgspec.msgpack.encode(m))), mutated(), st.binary(max_size=64))


@pytest.fixture(scope="module")
def cluster(loop_thread):
    cluster = loop_thread.run(TcpCluster.start(SECRET), timeout=START_TIMEOUT_S)
    FINGERPRINT[:] = [cluster.decode.fingerprint]
    yield cluster
    loop_thread.run(cluster.close())


class Users:
    """Other users' requests, one after another, from the start of the fuzzing until `stop`."""

    def __init__(self, cluster: TcpCluster, loop_thread):
        self.results: list[tuple[list[int], str | None]] = []
        self._stopping = asyncio.Event()
        self._task = asyncio.run_coroutine_threadsafe(self._serve(cluster), loop_thread.loop)
        self._loop = loop_thread.loop

    async def _serve(self, cluster: TcpCluster) -> None:
        while not self._stopping.is_set():
            outputs = [o async for o in cluster.router.generate(USER_PROMPT, USER_PARAMS)]
            self.results.append(([t for o in outputs for t in o.token_ids], outputs[-1].error))

    def stop(self) -> list[tuple[list[int], str | None]]:
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._task.result(TIMEOUT_S * 3)
        return self.results


@pytest.fixture(scope="module")
def users(cluster, loop_thread):
    users = Users(cluster, loop_thread)
    yield users
    users.stop()


async def _authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The real handshake as a router, by hand."""
    nonce = new_nonce()
    writer.write(
        _frame(
            msgspec.msgpack.encode(Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER, nonce=nonce, call_id=1))
        )
    )
    challenge = await _read(reader)
    assert isinstance(challenge, Challenge), challenge
    writer.write(
        _frame(
            msgspec.msgpack.encode(Prove(proof=client_proof(SECRET, Role.ROUTER, nonce, challenge.nonce), call_id=2))
        )
    )
    assert isinstance(await _read(reader), Welcome)


async def _read(reader: asyncio.StreamReader):
    (length,) = HEADER.unpack(await asyncio.wait_for(reader.readexactly(HEADER.size), TIMEOUT_S))
    return msgspec.msgpack.decode(await asyncio.wait_for(reader.readexactly(length), TIMEOUT_S), type=AnyMessage)


async def _fuzz_once(cluster: TcpCluster, instance_id: str, authenticated: bool, frames: list[bytes]) -> Stats:
    """Send `frames` to the instance, close, and return its stats as the router then sees them."""
    reader, writer = await asyncio.open_connection(LOCALHOST, cluster.instance(instance_id).port)
    try:
        if authenticated:
            await _authenticate(reader, writer)
        for frame in frames:
            writer.write(frame)
        await writer.drain()
        try:  # answers, or the server hanging up: either is fine
            while await asyncio.wait_for(reader.read(1 << 16), QUIET_S):
                pass
        except (asyncio.TimeoutError, ConnectionError):
            pass
    except ConnectionError:
        pass  # hung up on us mid-write
    finally:
        writer.close()
    return await cluster.router.registry.instances[instance_id].channel.call(GetStats(), TIMEOUT_S)


async def _fuzz_connections_gone(cluster: TcpCluster) -> None:
    """Wait until each instance has only the router's connection left (a closed connection's
    requests are aborted as it goes), then until its engine is idle."""
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while any(len(i._requests_of) > 1 for i in cluster.instances):
        assert asyncio.get_running_loop().time() < deadline, "fuzz connections were not cleaned up"
        await asyncio.sleep(0.01)  # the instances see the closes on their own schedule
    await cluster.assert_pools_free()


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    target=st.sampled_from(["decode-0", "prefill-0"]),
    authenticated=st.booleans(),
    frames=st.lists(FRAMES, min_size=1, max_size=6),
)
def test_fuzzed_control_frames_harm_no_one(cluster, users, loop_thread, target, authenticated, frames):
    stats = loop_thread.run(_fuzz_once(cluster, target, authenticated, frames), timeout=TIMEOUT_S * 2)
    assert stats.instance_id == target, "the instance stopped answering its router"


def test_after_the_fuzzing_every_pool_is_whole_and_every_user_was_served(cluster, users, loop_thread, make_engine):
    results = users.stop()
    loop_thread.run(_fuzz_connections_gone(cluster), timeout=SETTLE_S * 2)
    reference = make_engine(**msgspec.structs.asdict(CONFIG))
    expected = loop_thread.run(complete(reference, USER_PROMPT, USER_PARAMS)).token_ids
    assert results, "no user request ran during the fuzzing"
    for tokens, error in results:
        assert error is None and tokens == expected, "a user's request was affected by the fuzzing"
    assert sorted(cluster.router.registry.instances) == ["decode-0", "prefill-0"]
