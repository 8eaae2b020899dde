"""The router's line to a launcher that can start and stop instances (`--launcher ray`).

A launcher that scales pools starts the router with one end of a Unix socket pair inherited
(its number in `MINIPD_SCALER_FD`) and serves the other end (entrypoints/ray_scaling.py). No
listener is opened, so nothing else can reach it: holding the descriptor is the
authentication. Over it the router sends `ScaleCall`s and the launcher answers each with a
`ScaleReply` of the same `id`, one JSON object per line (at most `MAX_LINE_BYTES`; decoded
strictly into these structs, never unpickled):
- `hello`: the scaling config (`ScalingConfig` of minipd/policy/pool_scaling.py: bounds,
  idle window, cool-down);
- `room`: for each scaled role, whether the cluster could place one more instance now;
- `add` `role`: start an instance of `role` (placed as the launcher places them) and register
  it with this router; answers its name and address once it serves;
- `remove` `instance`: stop that instance's process (the router drained it first).
An answer with `error` set says why the call failed. `ScaleLink` is the router's end;
`read_call` and `write_reply` are the launcher's.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket

import msgspec

from minipd.policy.pool_scaling import ScalingConfig

ENV_FD = "MINIPD_SCALER_FD"
MAX_LINE_BYTES = 64 * 1024
CALL_TIMEOUT_S = {"hello": 30.0, "room": 30.0, "add": 300.0, "remove": 120.0}
OPS = tuple(CALL_TIMEOUT_S)


class ScaleCall(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: int
    op: str  # one of OPS
    role: str | None = None  # add
    instance: str | None = None  # remove


class ScaleReply(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    id: int
    error: str | None = None
    config: ScalingConfig | None = None  # hello
    room: dict[str, bool] | None = None  # room: role -> one more fits
    instance: str | None = None  # add: its name
    address: str | None = None  # add: HOST:PORT of its control port


class ScaleLinkError(RuntimeError):
    """The launcher refused or failed the call (its reason), or the link is gone."""


class ScaleLink:
    """The router's end: one call at a time may be in flight per caller; calls are matched to
    replies by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reading = asyncio.get_running_loop().create_task(self._read())
        self.closed_reason: str | None = None

    @classmethod
    async def from_env(cls) -> "ScaleLink | None":
        """The link a launcher handed this process, or None when started by none that scales."""
        text = os.environ.pop(ENV_FD, None)  # not for this process's own children
        if text is None:
            return None
        try:
            sock = socket.socket(fileno=int(text))
        except (ValueError, OSError) as exc:
            raise ScaleLinkError(f"{ENV_FD}={text!r}: not a socket this process inherited: {exc}") from None
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_LINE_BYTES)
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while line := await self._reader.readline():
                reply = msgspec.json.decode(line, type=ScaleReply)
                future = self._pending.pop(reply.id, None)
                if future is not None and not future.done():
                    future.set_result(reply)
            self.closed_reason = "the launcher closed the link"
        except (ValueError, msgspec.DecodeError, ConnectionError) as exc:  # an over-long or malformed line
            self.closed_reason = f"the link failed: {exc}"
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ScaleLinkError(self.closed_reason))
        self._pending.clear()

    async def call(self, op: str, role: str | None = None, instance: str | None = None) -> ScaleReply:
        """One call, answered within its op's timeout; ScaleLinkError with the launcher's
        reason when it failed."""
        if self.closed_reason is not None:
            raise ScaleLinkError(self.closed_reason)
        call = ScaleCall(id=next(self._ids), op=op, role=role, instance=instance)
        future = asyncio.get_running_loop().create_future()
        self._pending[call.id] = future
        self._writer.write(msgspec.json.encode(call) + b"\n")
        try:
            await self._writer.drain()
            reply = await asyncio.wait_for(future, CALL_TIMEOUT_S[op])
        except asyncio.TimeoutError:
            raise ScaleLinkError(f"the launcher did not answer {op} within {CALL_TIMEOUT_S[op]:.0f} s") from None
        except ConnectionError as exc:
            raise ScaleLinkError(f"the link failed: {exc}") from None
        finally:
            self._pending.pop(call.id, None)
        if reply.error is not None:
            raise ScaleLinkError(reply.error)
        return reply

    async def close(self) -> None:
        self._reading.cancel()
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def read_call(reader: asyncio.StreamReader) -> ScaleCall | None:
    """The launcher's end: the next call (None once the router closed its end). ValueError or
    msgspec.DecodeError on an over-long or malformed line."""
    line = await reader.readline()
    if not line:
        return None
    call = msgspec.json.decode(line, type=ScaleCall)
    if call.op not in OPS:
        raise ValueError(f"op: unknown {call.op!r}; one of {', '.join(OPS)}")
    return call


def write_reply(writer: asyncio.StreamWriter, reply: ScaleReply) -> None:
    writer.write(msgspec.json.encode(reply) + b"\n")
