"""Unit tests of the transport building blocks: coalescing, batching, the link limiter, the
registry, ending a request early, and the tcp receiver's handling of hostile or broken frames."""

from __future__ import annotations

import asyncio
import struct
import sys

import msgspec
import pytest
import torch
import uvloop

from minipd.transports.backends import MissingBackendError, available_transports, backend_class, create_transport
from minipd.transports.block_run import BlockRun, coalesce_runs, split_runs
from minipd.transports.ends_after_headers import EndsAfterHeaders
from minipd.transports.link_limiter import LinkLimiter
from minipd.transports.transfer_error import TransferError
from minipd.transports.wire import MAX_HEADER_BYTES, Hello, LayerHeader

BLOCK_SHAPE = (2, 16, 2, 32)
NUM_LAYERS = 4
NUM_BLOCKS = 32
CLOSE_TIMEOUT_S = 5.0


def test_coalesce_merges_only_where_both_sides_continue() -> None:
    runs = coalesce_runs([4, 0, 1, 2, 7, 8], [20, 10, 11, 13, 30, 31])
    assert runs == [BlockRun(0, 10, 2), BlockRun(2, 13, 1), BlockRun(4, 20, 1), BlockRun(7, 30, 2)]


def test_coalesce_rejects_bad_maps() -> None:
    with pytest.raises(ValueError):
        coalesce_runs([1, 2], [3])
    with pytest.raises(ValueError):
        coalesce_runs([1, 2], [3, 3])


def test_split_runs_caps_batches_and_keeps_every_block() -> None:
    runs = [BlockRun(0, 100, 5), BlockRun(10, 200, 1), BlockRun(20, 300, 7)]
    batches = split_runs(runs, 4)
    assert all(sum(r.num_blocks for r in batch) <= 4 for batch in batches)
    flat = [(r.src_start + i, r.dst_start + i) for batch in batches for r in batch for i in range(r.num_blocks)]
    assert flat == [(r.src_start + i, r.dst_start + i) for r in runs for i in range(r.num_blocks)]


def test_link_limiter_paces_to_the_rate() -> None:
    limiter = LinkLimiter(gbps=8.0, burst_bytes=0)  # 1 GB/s
    delays = [limiter.reserve(100_000_000) for _ in range(3)]  # 0.1 s each, booked back to back
    assert delays[0] == pytest.approx(0.1, abs=0.01)
    assert delays[2] == pytest.approx(0.3, abs=0.01)
    with pytest.raises(ValueError):
        LinkLimiter(gbps=0)


def test_registry_names_the_missing_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ucxx", None)  # makes `import ucxx` fail
    monkeypatch.delitem(sys.modules, "minipd.transports.ucx", raising=False)
    with pytest.raises(MissingBackendError, match=r"pip install -e '\.\[ucx\]'"):
        backend_class("ucx")
    with pytest.raises(ValueError, match="unknown transport"):
        backend_class("carrier-pigeon")
    assert {"loopback", "tcp"} <= set(available_transports())


def test_tcp_refuses_a_device_pool() -> None:
    pool = torch.empty((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE), device="meta")
    with pytest.raises(ValueError, match="CPU pool"):
        create_transport("tcp", pool, instance_id="d")


def _frame(message) -> bytes:
    header = msgspec.msgpack.encode(message)
    return struct.pack("!I", len(header)) + header


def _hello() -> bytes:
    block_bytes = 2 * 16 * 2 * 32 * 4
    return _frame(Hello("intruder", NUM_LAYERS, block_bytes))


HOSTILE_FRAMES = {
    "unknown request": lambda bb: _frame(LayerHeader("nobody", 0, [(0, 1)], bb)),
    "run outside the reservation": lambda bb: _frame(LayerHeader("reserved", 0, [(5, 2)], 2 * bb)),
    "byte count mismatch": lambda bb: _frame(LayerHeader("reserved", 0, [(0, 1)], 3 * bb)),
    "malformed header": lambda bb: struct.pack("!I", 5) + b"\xc1\xc1\xc1\xc1\xc1",
    "oversized header": lambda bb: struct.pack("!I", MAX_HEADER_BYTES + 1),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(HOSTILE_FRAMES))
def test_tcp_closes_the_link_on_a_bad_frame_and_leaves_the_pool(case: str) -> None:
    async def scenario():
        pool = torch.zeros((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE))
        transport = create_transport("tcp", pool, instance_id="decode")
        await transport.start()
        block_bytes = transport.layout.block_bytes
        transport.expect("reserved", "intruder", [0, 1, 2])
        host, port = transport._endpoint().decode().split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_hello() + HOSTILE_FRAMES[case](block_bytes) + b"\xff" * 2 * block_bytes)
        await writer.drain()
        try:  # the receiver hangs up: EOF, or a reset since it aborts the connection
            closed = await asyncio.wait_for(reader.read(), CLOSE_TIMEOUT_S)
        except ConnectionResetError:
            closed = b""
        with pytest.raises(TransferError) as failure:
            await transport.wait_landed("reserved", timeout=CLOSE_TIMEOUT_S)
        writer.close()
        await transport.close()
        return pool, closed, failure.value

    pool, closed, error = uvloop.run(scenario())
    assert closed == b""
    assert error.peer_id == "intruder" and error.request_id == "reserved"
    assert "within" not in error.reason  # failed because the link closed, not by timeout
    assert not pool.any(), "a rejected frame wrote into the pool"


class _HeldWrites(EndsAfterHeaders):
    """A backend whose writes announce their header at once, then hold their payload until the
    test releases it; it records every end-of-request message (None for an abort)."""

    backend = "held"

    def __init__(self, pool, *, instance_id: str) -> None:
        super().__init__(pool, instance_id=instance_id)
        self.release = asyncio.Event()
        self.headers_go = asyncio.Event()  # held only by tests that stagger the headers
        self.headers_go.set()
        self.payload_fails = False
        self.ends: list[int | None] = []

    async def _start(self) -> None:
        pass

    def _endpoint(self) -> bytes:
        return b"held"

    async def _connect(self, peer) -> None:
        pass

    async def _write(self, peer_id, request_id, layer, runs) -> None:
        await self.headers_go.wait()
        self._header_out(request_id)
        await self.release.wait()
        if self.payload_fails:
            raise TransferError(peer_id, request_id, "payload lost")

    async def _send_end(self, peer_id, request_id, num_bytes) -> None:
        self.ends.append(num_bytes)

    def _drop_peer(self, peer_id, reason) -> None:
        pass

    async def _close(self) -> None:
        pass


@pytest.mark.timeout(30)
@pytest.mark.parametrize("payload_fails", [False, True])
def test_finish_early_goes_out_before_the_payload_and_is_revoked_if_it_fails(payload_fails: bool) -> None:
    async def scenario():
        sender = _HeldWrites(torch.zeros((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE)), instance_id="prefill")
        receiver = _HeldWrites(torch.zeros((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE)), instance_id="decode")
        peer = await sender.connect(receiver.describe())
        sender.payload_fails = payload_fails
        for layer in range(NUM_LAYERS):
            sender.write_layer(peer, "r", layer, [BlockRun(0, 4, 2)])
        finishing = asyncio.ensure_future(sender.finish_request(peer, "r"))
        for _ in range(1000):  # loop turns, not time: the writes are held until released below
            if sender.ends:
                break
            await asyncio.sleep(0)
        ended_while_held = list(sender.ends)
        sender.release.set()
        try:
            return ended_while_held, await finishing, sender.ends
        except TransferError as exc:
            return ended_while_held, exc, sender.ends

    held, outcome, ends = uvloop.run(scenario())
    num_bytes = NUM_LAYERS * 2 * 2 * 16 * 2 * 32 * 4
    assert held == [num_bytes], "the end of the request waited for the payload"
    if payload_fails:
        assert isinstance(outcome, TransferError) and "payload lost" in outcome.reason
        assert ends == [num_bytes, None], "a failed payload after an early finish must be followed by an abort"
    else:
        assert outcome.num_bytes == num_bytes and ends == [num_bytes]


@pytest.mark.timeout(30)
def test_finish_early_waits_for_headers_of_layers_written_later() -> None:
    """Layer-wise streaming: layer 0's header is out before layer 1 is even written; the end of
    the request must still wait for the later layers' headers."""

    async def scenario():
        sender = _HeldWrites(torch.zeros((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE)), instance_id="prefill")
        receiver = _HeldWrites(torch.zeros((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE)), instance_id="decode")
        peer = await sender.connect(receiver.describe())
        sender.write_layer(peer, "r", 0, [BlockRun(0, 4, 2)])
        for _ in range(10):  # layer 0 announces its header
            await asyncio.sleep(0)
        sender.headers_go.clear()
        for layer in range(1, NUM_LAYERS):
            sender.write_layer(peer, "r", layer, [BlockRun(0, 4, 2)])
        finishing = asyncio.ensure_future(sender.finish_request(peer, "r"))
        for _ in range(100):  # loop turns: the later headers are held until released below
            await asyncio.sleep(0)
        ended_before_headers = list(sender.ends)
        sender.headers_go.set()
        for _ in range(100):
            if sender.ends:
                break
            await asyncio.sleep(0)
        ended_after_headers = list(sender.ends)
        sender.release.set()
        return ended_before_headers, ended_after_headers, await finishing

    before, after, sent = uvloop.run(scenario())
    num_bytes = NUM_LAYERS * 2 * 2 * 16 * 2 * 32 * 4
    assert before == [], "the request ended before every layer's header was out"
    assert after == [num_bytes], "the request did not end early once every header was out"
    assert sent.num_bytes == num_bytes
