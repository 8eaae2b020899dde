"""Fuzzing the tcp KV data plane (hypothesis): random headers, lengths and partial payloads on
links to a receiver that expects a real sender's request meanwhile.

With a cluster secret, a fuzzing link cannot authenticate: not one byte of the pool may
change, and the real sender's request still lands byte-exact. Without a secret a link may
name any sender, so the fuzzer names one of its own with a reservation of its own: it may
write inside that reservation, and nowhere else.
"""

from __future__ import annotations

import asyncio
import struct

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minipd.transports import wire as kv
from minipd.transports.backends import create_transport
from minipd.transports.block_run import BlockRun
from minipd.transports.shared_secret import SharedSecret

BLOCK_SHAPE = (2, 4, 1, 8)  # 256-byte blocks: payloads stay small
NUM_LAYERS, NUM_BLOCKS = 2, 16
BLOCK_BYTES = 2 * 4 * 1 * 8 * 4
SECRET = SharedSecret(b"the kv fuzz tests' cluster secret")
FUZZ_BLOCKS = [4, 5, 6]  # the fuzzer's own reservation (no-secret mode)
USER_BLOCKS = [10, 11]  # the real sender's
TIMEOUT_S = 10.0
QUIET_S = 0.02
MAX_EXAMPLES = 80
PREFIX = struct.Struct("!I")


def _frame(message) -> bytes:
    header = msgspec.msgpack.encode(message)
    return PREFIX.pack(len(header)) + header


request_ids = st.sampled_from(["fz", "user", "nobody", ""])
runs = st.lists(st.tuples(st.integers(-2, NUM_BLOCKS + 2), st.integers(-1, 4)), max_size=4)
headers = st.one_of(
    st.builds(
        kv.LayerHeader,
        request_id=request_ids,
        layer=st.integers(-1, NUM_LAYERS + 1),
        runs=runs,
        num_bytes=st.sampled_from([0, 1, BLOCK_BYTES, 2 * BLOCK_BYTES, 3 * BLOCK_BYTES, 2**40]),
    ),
    st.builds(kv.Finish, request_id=request_ids, num_bytes=st.sampled_from([0, BLOCK_BYTES, 2 * BLOCK_BYTES])),
    st.builds(kv.Abort, request_id=request_ids),
    st.builds(
        kv.Hello,
        peer_id=st.sampled_from(["fuzzer", "prefill"]),
        num_layers=st.integers(0, 3),
        block_bytes=st.sampled_from([BLOCK_BYTES, 1]),
        nonce=st.binary(max_size=40),
        proof=st.binary(max_size=40),
    ),
    st.builds(kv.Challenge, nonce=st.binary(max_size=8)),
    st.builds(kv.HelloAck, proof=st.binary(max_size=8)),
    st.builds(kv.Refused, reason=st.text(max_size=8)),
)


@st.composite
def plausible_writes(draw) -> bytes:
    """A layer header whose byte count matches its runs, then all or part of its payload."""
    starts = st.one_of(st.sampled_from(FUZZ_BLOCKS), st.integers(-1, NUM_BLOCKS))
    chosen = draw(st.lists(st.tuples(starts, st.integers(1, 3)), min_size=1, max_size=3))
    num_bytes = sum(count for _, count in chosen) * BLOCK_BYTES
    header = kv.LayerHeader(
        draw(st.sampled_from(["fz", "fz", "user", "nobody"])), draw(st.integers(0, NUM_LAYERS)), chosen, num_bytes
    )
    sent = draw(st.sampled_from([num_bytes, num_bytes, num_bytes // 2, 1]))
    return _frame(header) + b"\xab" * sent


def _parts(claimable: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    return st.one_of(
        plausible_writes(),
        claimable.map(_frame),
        st.binary(min_size=1, max_size=3 * BLOCK_BYTES),  # payload, whole or partial, or noise
        st.integers(0, 2**32 - 1).map(PREFIX.pack),  # a bare length prefix
    )


# With a secret the fuzzer tries to pass for the real sender; without one it could simply be
# it (the documented risk), so there it only ever names itself.
secured_parts = _parts(headers)
unsecured_parts = _parts(headers.filter(lambda m: not (isinstance(m, kv.Hello) and m.peer_id == "prefill")))


class Receiver:
    """A tcp receiver on its own loop thread's loop, expecting the real sender's request."""

    def __init__(self, loop_thread, secret: SharedSecret | None):
        self.loop_thread, self.secret = loop_thread, secret
        self.pool = torch.zeros((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE))
        self.transport = create_transport("tcp", self.pool, instance_id="decode", secret=secret)
        loop_thread.run(self.transport.start())
        host, port = self.transport._endpoint().decode().split(":")
        self.address = (host, int(port))
        if secret is None:
            self.transport.expect("fz", "fuzzer", FUZZ_BLOCKS)
        self.transport.expect("user", "prefill", USER_BLOCKS)
        self.original = self.pool.clone()

    def changed_blocks(self) -> set[int]:
        diff = self.pool.view(NUM_LAYERS, NUM_BLOCKS, -1) != self.original.view(NUM_LAYERS, NUM_BLOCKS, -1)
        return {b for b in range(NUM_BLOCKS) if bool(diff[:, b].any())}

    async def fuzz(self, hello: bool, data: list[bytes]) -> None:
        if self.secret is None:  # a violation fails the fuzzer's request: give it a fresh one each time
            self.transport.poll_landed()
            if self.transport._ledger.peer_of("fz") is None:
                self.transport.expect("fz", "fuzzer", FUZZ_BLOCKS)
        reader, writer = await asyncio.open_connection(*self.address)
        try:
            if hello:  # no secret: claim our own sender id first, as a link must
                writer.write(_frame(kv.Hello("fuzzer", NUM_LAYERS, BLOCK_BYTES)))
            for part in data:
                writer.write(part)
            await writer.drain()
            while await asyncio.wait_for(reader.read(1 << 16), QUIET_S):
                pass
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def links_gone(self) -> None:
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S
        while self.transport._receivers:
            assert asyncio.get_running_loop().time() < deadline, "fuzz links still open"
            await asyncio.sleep(0.01)  # the receiver sees each close on its own schedule

    async def real_sender_lands(self) -> bool:
        sender = create_transport(
            "tcp", torch.full((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE), 7.0), instance_id="prefill", secret=self.secret
        )
        await sender.start()
        try:
            peer = await sender.connect(self.transport.describe())
            for layer in range(NUM_LAYERS):
                sender.write_layer(peer, "user", layer, [BlockRun(0, USER_BLOCKS[0], len(USER_BLOCKS))])
            await sender.finish_request(peer, "user")
            landed = await self.transport.wait_landed("user", TIMEOUT_S)
            return landed.num_bytes == NUM_LAYERS * len(USER_BLOCKS) * BLOCK_BYTES and bool(
                (self.pool[:, USER_BLOCKS] == 7.0).all()
            )
        finally:
            await sender.close()

    def close(self) -> None:
        self.loop_thread.run(self.transport.close())


@pytest.fixture(scope="module")
def secured(loop_thread):
    receiver = Receiver(loop_thread, SECRET)
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def unsecured(loop_thread):
    receiver = Receiver(loop_thread, None)
    yield receiver
    receiver.close()


FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.lists(secured_parts, min_size=1, max_size=8))
def test_fuzz_with_a_secret_writes_nothing(secured, loop_thread, data):
    loop_thread.run(secured.fuzz(False, data), timeout=TIMEOUT_S * 2)
    assert secured.changed_blocks() == set(), "an unauthenticated link wrote into the pool"


def test_with_a_secret_the_real_sender_lands_after_the_fuzzing(secured, loop_thread):
    loop_thread.run(secured.links_gone())
    assert secured.changed_blocks() == set()
    assert loop_thread.run(secured.real_sender_lands()), "the real sender's request did not land byte-exact"


@FUZZ
@given(hello=st.booleans(), data=st.lists(unsecured_parts, min_size=1, max_size=8))
def test_fuzz_without_a_secret_writes_only_inside_its_own_reservation(unsecured, loop_thread, hello, data):
    loop_thread.run(unsecured.fuzz(hello, data), timeout=TIMEOUT_S * 2)
    assert unsecured.changed_blocks() <= set(FUZZ_BLOCKS), "a write landed outside the fuzzer's reservation"


def test_without_a_secret_the_real_sender_lands_after_the_fuzzing(unsecured, loop_thread):
    loop_thread.run(unsecured.links_gone())
    assert unsecured.changed_blocks() <= set(FUZZ_BLOCKS)
    assert unsecured.changed_blocks(), "the fuzzing never got a write accepted: it tested nothing"
    assert loop_thread.run(unsecured.real_sender_lands())
