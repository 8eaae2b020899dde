"""The fault matrix's cells and how one is played against a live process cluster.

A cell arms a fault point (`minipd.transports.fault_points`), sends one request, waits for the instance
that reaches the point to say so, then does something to it: kill -9 it, keep it frozen past
the liveness bound, drop the client, or just let a stalled transfer be. The request must then
complete (retried or recomputed) or fail with an error naming what failed, within the bound;
afterwards every surviving instance has all its blocks back and the cluster serves the next
request. Frozen instances are resumed and registered again; killed ones stay dead (the
cluster starts with spares, so that every cell still finds the instances it needs: starting
a process costs more than a cell on a small machine).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from typing import NamedTuple

from stopped_process import until_stopped

from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.process_cluster import ProcessCluster

LIVENESS_S = 3.0
LEASE_S = 2.0
STALL_S = 4.0  # a stalled KV link: longer than the lease, so the decode side gives the reservation up
BOUND_S = LIVENESS_S + LEASE_S + 15.0  # a faulted request ends within this (on a busy 2-core machine)
SETTLE_S = 20.0  # every pool is full again within this after a cell
PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
# Spares for the kills: 2 prefill and 3 decode instances die, and a killed decode instance's
# request is retried on another one.
CLUSTER_ARGV = [
    "--num-prefill",
    "3",
    "--num-decode",
    "4",
    "--liveness-timeout-s",
    str(LIVENESS_S),
    "--lease-s",
    str(LEASE_S),
    "--shutdown-timeout-s",
    "1",
]


class Cell(NamedTuple):
    point: str  # the fault point armed
    action: str  # what it does when reached: "stop", or "stall SECONDS"
    then: str  # "kill", "freeze" (past the liveness bound), "drop" (the client), or "wait"
    expect: str  # "complete", "fail" (with a clear error), or "abort" (the client left)
    retried_via_prefill: bool = False  # completes by a second try whose KV moved again (not a recompute)


CELLS = {
    "decode_killed_after_reserving": Cell("decode.reserved", "stop", "kill", "complete", retried_via_prefill=True),
    "decode_killed_mid_transfer": Cell("kv.partly_landed", "stop", "kill", "complete", retried_via_prefill=True),
    "decode_killed_mid_decode": Cell("decode.streaming", "stop", "kill", "fail"),
    "prefill_killed_mid_prefill": Cell("prefill.computing", "stop", "kill", "complete"),
    "prefill_killed_mid_transfer": Cell("kv.layer_written", "stop", "kill", "complete"),
    "prefill_frozen_mid_transfer": Cell("kv.layer_written", "stop", "freeze", "complete"),
    "decode_frozen_mid_decode": Cell("decode.streaming", "stop", "freeze", "fail"),
    "client_dropped_after_reserving": Cell("decode.reserved", "stop", "drop", "abort"),
    "client_dropped_mid_prefill": Cell("prefill.computing", "stop", "drop", "abort"),
    "client_dropped_mid_transfer": Cell("kv.layer_written", "stop", "drop", "abort"),
    "client_dropped_mid_decode": Cell("decode.streaming", "stop", "drop", "abort"),
    "kv_link_stalled_mid_payload": Cell("kv.mid_payload", f"stall {STALL_S}", "wait", "complete"),
}


class Outcome(NamedTuple):
    faulted: str  # the instance that reached the point
    last_error: str | None
    num_output_tokens: int
    seconds: float  # from the fault to the request's end
    transfer: object  # the final output's TransferInfo (None: prefilled on its decode instance)


async def play(cluster: ProcessCluster, cell: Cell, seed: int) -> Outcome:
    """Play one cell: returns how the request ended. Leaves the cluster whole again."""
    cluster.arm(cell.point, cell.action)
    client = await cluster.client()
    prompt = [random.Random(seed).randrange(256) for _ in range(100)]  # fresh: no prefix-cache hit anywhere
    collected = asyncio.ensure_future(_collect(client.submit(prompt, PARAMS)))
    name, _ = await _first_fault(cluster)
    loop = asyncio.get_running_loop()
    faulted_at = loop.time()
    pid = cluster.child(name).process.pid
    if cell.action == "stop":
        await until_stopped(pid, BOUND_S)  # it announces the point just before it stops itself
    try:
        if cell.then == "kill":
            os.kill(pid, signal.SIGKILL)
        elif cell.then == "drop":
            await client.close()
            os.kill(pid, signal.SIGCONT)
        outputs = await asyncio.wait_for(collected, BOUND_S)
        seconds = loop.time() - faulted_at
        if cell.then == "freeze":
            await until_unlisted(cluster, name, BOUND_S)  # declared dead, however the request ended
    finally:
        await client.close()
    await _recover(cluster, cell, name)
    last = outputs[-1]
    return Outcome(name, last.error, last.num_output_tokens, seconds, last.transfer)


def surviving(cluster: ProcessCluster) -> list[str]:
    return sorted(c.name for c in cluster.children if c.name != "router" and c.process.returncode is None)


async def _recover(cluster: ProcessCluster, cell: Cell, name: str) -> None:
    if cell.then == "kill":
        await cluster.child(name).process.wait()
    elif cell.then == "freeze":
        os.kill(cluster.child(name).process.pid, signal.SIGCONT)
        await cluster.rejoin(name)


async def _collect(stream) -> list:
    return [output async for output in stream]


async def _first_fault(cluster: ProcessCluster) -> tuple[str, str]:
    """(child name, point) of the first child that reports reaching a fault point."""
    waits = {asyncio.ensure_future(child.faults.get()): child.name for child in cluster.children}
    try:
        done, _ = await asyncio.wait(waits, timeout=BOUND_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    assert done, "no instance reached the armed fault point"
    first = done.pop()
    return waits[first], first.result()[0]


async def until_unlisted(cluster: ProcessCluster, name: str, timeout: float) -> None:
    client = await cluster.client()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while name in [s.instance_id for s in await client.stats()]:
            assert loop.time() < deadline, f"{name} was not declared dead within {timeout} s"
            await asyncio.sleep(0.1)  # condition poll, bounded
    finally:
        await client.close()


async def settled_stats(cluster: ProcessCluster) -> list:
    """Once every instance is registered and every pool is full again (bounded), their stats."""
    client = await cluster.client()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S
        while True:
            stats = await client.stats(settle=True)
            whole = sorted(s.instance_id for s in stats) == surviving(cluster) and all(
                s.num_used_blocks == 0 and s.num_reservations == 0 and s.num_fencing_blocks == 0 for s in stats
            )
            if whole or loop.time() > deadline:
                return stats
            await asyncio.sleep(0.2)  # a stalled sender gives its blocks back when its stall ends
    finally:
        await client.close()


async def probe(cluster: ProcessCluster, seed: int):
    """The next request after a cell: its last output."""
    client = await cluster.client()
    try:
        prompt = [random.Random(seed).randrange(256) for _ in range(100)]
        outputs = await asyncio.wait_for(_collect(client.submit(prompt, PARAMS)), BOUND_S)
        return outputs[-1]
    finally:
        await client.close()
