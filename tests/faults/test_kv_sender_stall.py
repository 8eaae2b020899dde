"""A KV sender that stalls mid-payload after its reservation was aborted leaks no block, and
its late bytes land nowhere (reproduced as reported: half of layer 0's payload sent over the
TCP KV port, then the control connection that made the reservation closed)."""

from __future__ import annotations

import asyncio

import msgspec
import torch
from disagg_helpers import CONFIG

from minipd.control.channel import Channel
from minipd.control.messages import PROTOCOL_VERSION, Hello, Reserve
from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.engine.engine import Engine
from minipd.transports import wire as wire
from minipd.transports.tcp_receiver import PREFIX

FAKE_PREFILL = "prefill-that-stalls"
PROMPT = list(range(300))  # 19 blocks of 16 tokens
# Longer than the abort drain window the decode instance had (10 s): the blocks must be back well before.
BLOCKS_BACK_WITHIN_S = 15.0


def _frame(message, payload: bytes = b"") -> bytes:
    header = wire.message_encoder.encode(message)
    return PREFIX.pack(len(header)) + header + payload


async def _until(condition, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)  # condition poll, bounded


async def _closed_by_peer(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionResetError:  # it aborted the connection
        return True


def _receiving(decode: Instance, request_id: str) -> bool:
    """The decode instance's receiver is inside the payload of one of `request_id`'s frames."""
    entry = decode.transport._ledger._expected.get(request_id)
    return entry is not None and entry.in_flight > 0


def test_stalled_sender_after_abort_leaks_no_block_and_its_late_bytes_land_nowhere(loop_thread):
    async def scenario():
        decode = await Instance.create(Engine(CONFIG), Role.DECODE, "decode-0", "tcp", "tiny")
        await decode.serve("127.0.0.1", 0)
        try:
            control = await Channel.connect("127.0.0.1", decode.port, None, "a-router")
            await control.call(Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER))
            reserved = await control.call(
                Reserve(request_id="stalled", token_ids=PROMPT, prefill_instance=FAKE_PREFILL)
            )
            held = decode.stats().num_used_blocks
            host, _, port = wire.decode_description(decode.transport.describe()).endpoint.decode().rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            layout = decode.transport.layout
            runs = [(block, 1) for block in reserved.dst_block_ids]
            num_bytes = len(runs) * layout.block_bytes
            late = b"\xab" * num_bytes
            writer.write(_frame(wire.Hello(FAKE_PREFILL, layout.num_layers, layout.block_bytes)))
            writer.write(_frame(wire.LayerHeader("stalled", 0, runs, num_bytes), late[: num_bytes // 2]))
            await writer.drain()
            await _until(lambda: _receiving(decode, "stalled"), 10, "the receiver never started on the payload")
            await control.close()  # the reservation's router is gone: the decode instance aborts it
            await _until(
                lambda: decode.stats().num_used_blocks == 0,
                BLOCKS_BACK_WITHIN_S,
                f"blocks still used: {decode.stats()}",
            )
            freed = decode.engine.kv_pool[:, reserved.dst_block_ids].clone()
            # the stalled sender wakes up: the rest of its payload, then a frame the receiver refuses
            # (an unknown request), after which it closes the link: every late byte has been read by then
            writer.write(late[num_bytes // 2 :])
            writer.write(
                _frame(
                    wire.LayerHeader("never-reserved", 0, runs[:1], layout.block_bytes), b"\xcd" * layout.block_bytes
                )
            )
            await writer.drain()
            closed_by_receiver = await _closed_by_peer(reader)
            after = decode.engine.kv_pool[:, reserved.dst_block_ids]
            writer.close()
            return (
                held,
                len(reserved.dst_block_ids),
                decode.stats(),
                closed_by_receiver,
                torch.equal(freed.view(torch.uint8), after.contiguous().view(torch.uint8)),
            )
        finally:
            await decode.close()

    held, reserved_blocks, stats, closed_by_receiver, untouched = loop_thread.run(scenario(), timeout=60)
    assert held == reserved_blocks == -(-len(PROMPT) // CONFIG.block_size)
    assert stats.num_used_blocks == 0 and stats.num_free_blocks == stats.num_blocks, msgspec.to_builtins(stats)
    assert closed_by_receiver
    assert untouched, "a late byte landed in a freed block"
