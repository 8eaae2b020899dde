"""Test harness: the far side of a transport conformance test, in another process (tcp, ucx,
nixl) or in this one (loopback), driven through the same async `Peer` calls.

Commands travel as msgpack dicts over a multiprocessing pipe; the pipe doubles as the
"control plane" liveness signal: when the peer process dies, `on_lost` fires, as a real
control plane would report it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable

import msgspec
import torch
from stopped_process import wait_until_stopped

from minipd.transports import fault_points
from minipd.transports.backends import create_transport
from minipd.transports.block_run import coalesce_runs
from minipd.transports.transfer_error import TransferError

# The tiny model's KV block: [K/V, block_size, kv_heads, head_dim] in fp32 = 8 KiB.
BLOCK_SHAPE = (2, 16, 2, 32)
NUM_LAYERS = 4
START_TIMEOUT_S = 60.0
COMMAND_TIMEOUT_S = 30.0
RESUME_BOUND_S = 10.0  # a peer that announced its fault point stops itself within this

_encode = msgspec.msgpack.encode
_decode = msgspec.msgpack.decode


def make_pool(num_blocks: int, seed: int) -> torch.Tensor:
    """A pool whose bytes are a pure function of `seed`, so either side can recompute them."""
    pool = torch.empty((NUM_LAYERS, num_blocks, *BLOCK_SHAPE), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    flat = pool.view(-1).view(torch.uint8)
    flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=generator))
    return pool


class _Agent:
    """Executes commands against one transport (in the peer process, or in-process)."""

    def __init__(self, backend: str, instance_id: str, num_blocks: int, seed: int, options: dict) -> None:
        self.pool = make_pool(num_blocks, seed)
        self.transport = create_transport(backend, self.pool, instance_id=instance_id, **options)

    async def run(self, command: dict, progress: Callable[[dict], None]) -> object:
        t = self.transport
        match command["op"]:
            case "start":
                await t.start()
                return t.describe()
            case "connect":
                return await t.connect(command["description"])
            case "expect":
                t.expect(command["request_id"], command["peer_id"], command["dst_ids"])
                return None
            case "send":
                return await self._send(command, progress)
            case "finish":
                sent = await t.finish_request(command["peer_id"], command["request_id"])
                return sent.num_bytes
            case "wait_landed":
                landed = await t.wait_landed(command["request_id"], command["timeout"])
                return landed.num_bytes
            case "read_blocks":
                return self.pool[:, command["block_ids"]].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            case "peer_lost":
                t.peer_lost(command["peer_id"], "control plane: peer process died")
                return None
            case "abort":
                return await t.abort(command["request_id"], peer_id=command.get("peer_id"))
        raise ValueError(f"unknown command {command['op']!r}")

    async def _send(self, command: dict, progress: Callable[[dict], None]) -> dict:
        t = self.transport
        runs = coalesce_runs(command["src_ids"], command["dst_ids"])
        loop = asyncio.get_running_loop()
        started = loop.time()
        writes = [t.write_layer(command["peer_id"], command["request_id"], layer, runs) for layer in command["layers"]]
        if command.get("report_first_write"):
            await writes[0]
            progress({"first_write_done": True})
        await asyncio.gather(*writes)
        num_bytes = None
        if command.get("finish", True):
            num_bytes = (await t.finish_request(command["peer_id"], command["request_id"])).num_bytes
        return {"elapsed_s": loop.time() - started, "num_bytes": num_bytes}


def peer_main(conn, backend: str, instance_id: str, num_blocks: int, seed: int, options: dict) -> None:
    """Entry point of a peer process: serve commands from `conn` until it closes."""
    logging.basicConfig(level=logging.WARNING)
    # A fault point that fires (see minipd.transports.fault_points) is reported over the pipe.
    fault_points.announce = lambda name, detail: conn.send_bytes(_encode({"fault": name, "detail": detail}))
    import uvloop

    uvloop.run(_serve(conn, _Agent(backend, instance_id, num_blocks, seed, options)))


async def _serve(conn, agent: _Agent) -> None:
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    tasks = set()

    def reply(message: dict) -> None:
        conn.send_bytes(_encode(message))

    async def handle(command: dict) -> None:
        ident = command["id"]
        try:
            value = await agent.run(command, lambda update: reply({"id": ident, "progress": update}))
            reply({"id": ident, "value": value})
        except TransferError as exc:
            reply({"id": ident, "transfer_error": [exc.peer_id, exc.request_id, exc.reason]})
        except Exception as exc:  # report, so the test fails with the reason
            reply({"id": ident, "error": f"{type(exc).__name__}: {exc}"})

    def readable() -> None:
        try:
            command = _decode(conn.recv_bytes())
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            closed.done() or closed.set_result(None)
            return
        task = loop.create_task(handle(command))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    loop.add_reader(conn.fileno(), readable)
    await closed
    await agent.transport.close()


class PeerError(Exception):
    """A peer command failed with something other than a TransferError."""


class Peer:
    """Async client for a peer: `await call(op, **args)` returns the command's value or raises
    TransferError / PeerError as the peer did. `kill()` SIGKILLs a process peer."""

    def __init__(
        self,
        backend: str,
        instance_id: str,
        num_blocks: int,
        seed: int,
        on_lost: Callable[[str], None] | None = None,
        **options,
    ) -> None:
        self.backend = backend
        self.instance_id = instance_id
        self._on_lost = on_lost
        self._next_id = 0
        self._pending: dict[int, tuple[asyncio.Future, asyncio.Queue | None]] = {}
        self._agent: _Agent | None = None
        self._process = None
        self._tasks: set[asyncio.Task] = set()
        self.faults: asyncio.Queue[str] = asyncio.Queue()  # names of the fault points it reached
        if backend == "loopback":
            self._agent = _Agent(backend, instance_id, num_blocks, seed, options)
        else:
            context = multiprocessing.get_context("spawn")
            self._conn, child = context.Pipe()
            self._process = context.Process(
                target=peer_main, daemon=True, args=(child, backend, instance_id, num_blocks, seed, options)
            )
            self._process.start()
            child.close()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def transport(self):
        """The in-process transport (loopback only)."""
        return self._agent.transport

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self._process is not None:
            loop.add_reader(self._conn.fileno(), self._readable)

    async def call(
        self, op: str, timeout: float = COMMAND_TIMEOUT_S, progress: asyncio.Queue | None = None, **args
    ) -> object:
        if self._agent is not None:
            put = progress.put_nowait if progress is not None else (lambda update: None)
            task = asyncio.ensure_future(self._agent.run({"op": op, **args}, put))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return await asyncio.wait_for(task, timeout)
        self._next_id += 1
        future = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = (future, progress)
        self._conn.send_bytes(_encode({"op": op, "id": self._next_id, **args}))
        return await asyncio.wait_for(future, timeout)

    def _readable(self) -> None:
        try:
            message = _decode(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._loop.remove_reader(self._conn.fileno())
            for future, _ in self._pending.values():
                future.done() or future.set_exception(PeerError("peer process died"))
            self._pending.clear()
            if self._on_lost is not None:
                self._on_lost(self.instance_id)
            return
        if "fault" in message:
            self.faults.put_nowait(message["fault"])
            return
        future, progress = self._pending.get(message["id"], (None, None))
        if future is None:
            return
        if "progress" in message:
            if progress is not None:
                progress.put_nowait(message["progress"])
            return
        del self._pending[message["id"]]
        if "transfer_error" in message:
            future.set_exception(TransferError(*message["transfer_error"]))
        elif "error" in message:
            future.set_exception(PeerError(message["error"]))
        else:
            future.set_result(message["value"])

    def resume(self) -> None:
        """Let a peer stopped at a fault point go on (SIGCONT; in-process: release the stall)."""
        if self._process is not None:
            wait_until_stopped(self._process.pid, RESUME_BOUND_S)  # it announces the point, then stops
            os.kill(self._process.pid, signal.SIGCONT)
        else:
            fault_points.release("kv.mid_payload")

    def kill(self) -> None:
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGKILL)
        else:  # an in-process peer "dies": its work stops mid-way and it leaves the hub
            for task in self._tasks:
                task.cancel()
            asyncio.ensure_future(self._agent.transport.close())  # cancels its writes, leaves the hub
            if self._on_lost is not None:
                self._on_lost(self.instance_id)

    def stop(self) -> None:
        if self._process is not None:
            if self._loop is not None and self._conn.fileno() >= 0:
                try:
                    self._loop.remove_reader(self._conn.fileno())
                except Exception:
                    pass
            self._conn.close()
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout=5)
