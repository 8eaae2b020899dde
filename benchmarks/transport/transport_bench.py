"""Transport bandwidth: 64 MiB of KV per request between two processes, per backend, vs memcpy.

For each backend a receiver process reserves blocks and a sender process (both fresh) writes
every layer of a request into them, then finishes it; the time runs from the first write to
the receiver seeing the request landed (both read the same monotonic clock). Pools are
allocated as an instance allocates its KV pool. Two block maps: 1 MiB blocks in shuffled
order (one 1 MiB move each), and the tiny model's 8 KiB blocks handed out in chunks by an
allocator (per-block pairs that coalescing merges).

Baselines: single-thread memcpy of the same bytes, timed by the sender process next to each
repetition (alternately before and after it), so `ratio_to_memcpy` is the median of
per-repetition ratios and the machine's drift (other jobs come and go) hits both sides of
each ratio alike; and a raw socket (blocking sendall / recv_into a preallocated buffer),
measured once per round. Every backend is measured in several rounds, in turn, so that a slow
spell of the machine does not fall on one backend only. Rates are in Gbit/s (`*_gbps`;
8 Gbit/s = 1 GB/s).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import random
import statistics
import time

import numpy as np
import torch

from benchmarks.loadgen.baseline_plots import plot_transport as plot  # noqa: F401 (bench.py --plot)
from benchmarks.transport.baselines import GBIT, MemcpyTimer, raw_socket_gbps
from minipd.engine.kv_pool import allocate_host_tensor
from minipd.transports.backends import BACKENDS, available_transports, create_transport
from minipd.transports.block_run import coalesce_runs
from minipd.transports.loopback_hub import LoopbackHub

MIB = 1 << 20
NUM_LAYERS = 4  # the tiny model's layer count
TINY_BLOCK_SHAPE = (2, 16, 2, 32)  # K/V x block_size x kv_heads x head_dim, fp32: 8 KiB
LARGE_BLOCK_SHAPE = (MIB // 4,)  # fp32: 1 MiB blocks
SPARE_FRACTION = 0.5  # pools hold this much more than one request, so maps can scatter
START_TIMEOUT_S = 120.0
LANDED_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="comma-separated transports to measure (default: all installed)"
    )
    parser.add_argument("--request-mib", type=int, default=64, help="KV bytes per request, MiB (default 64)")
    parser.add_argument("--repeats", type=int, default=9, help="timed repetitions per case and round")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="times every backend is measured afresh, in turn; the median over all rounds counts",
    )
    parser.add_argument(
        "--small-chunk-blocks",
        type=int,
        default=32,
        help="the small-block map hands out destination blocks in chunks of this many (default 32)",
    )
    parser.add_argument("--link-gbps", type=float, default=None, help="cap each transport's egress (Gbit/s)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run: loopback, 4 MiB")


QUICK = {"backends": "loopback", "request_mib": 4, "repeats": 2, "rounds": 1}


# ---- transports ------------------------------------------------------------------------


class Case:
    """A pool shape and the block map of one request."""

    def __init__(
        self, name: str, block_shape: tuple[int, ...], request_bytes: int, chunk_blocks: int, seed: int
    ) -> None:
        self.name = name
        self.block_shape = block_shape
        block_bytes = int(np.prod(block_shape)) * 4
        self.blocks_per_request = request_bytes // NUM_LAYERS // block_bytes
        self.num_bytes = NUM_LAYERS * self.blocks_per_request * block_bytes
        self.num_blocks = int(self.blocks_per_request * (1 + SPARE_FRACTION))
        rng = random.Random(seed)
        self.src_ids = _chunked_ids(rng, self.num_blocks, self.blocks_per_request, chunk_blocks)
        self.dst_ids = _chunked_ids(rng, self.num_blocks, self.blocks_per_request, chunk_blocks)
        self.num_runs = len(coalesce_runs(self.src_ids, self.dst_ids))

    def make_pool(self) -> torch.Tensor:
        """Allocated as an instance allocates its KV pool (touched, huge pages where offered)."""
        return allocate_host_tensor((NUM_LAYERS, self.num_blocks, *self.block_shape), torch.float32)


def _chunked_ids(rng: random.Random, num_blocks: int, count: int, chunk: int) -> list[int]:
    """`count` block ids handed out in chunks of `chunk` consecutive ids at shuffled places."""
    starts = list(range(0, num_blocks - chunk + 1, chunk))
    rng.shuffle(starts)
    ids: list[int] = []
    for start in starts:
        ids.extend(range(start, start + min(chunk, count - len(ids))))
        if len(ids) == count:
            return ids
    raise ValueError("pool too small for the block map")


def _receiver_main(conn, backend: str, case: Case, options: dict) -> None:
    logging.basicConfig(level=logging.WARNING)
    import uvloop

    uvloop.run(_receive(conn, backend, case, options))


async def _receive(conn, backend: str, case: Case, options: dict) -> None:
    transport = create_transport(backend, case.make_pool(), instance_id="decode", **options)
    await transport.start()
    loop = asyncio.get_running_loop()
    conn.send(transport.describe())
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command is None:
            break
        transport.expect(command, "prefill", case.dst_ids)
        conn.send("ready")
        await transport.wait_landed(command, timeout=LANDED_TIMEOUT_S)
        conn.send(time.monotonic())
    await transport.close()


async def _measure(backend: str, case: Case, repeats: int, options: dict) -> list[tuple[float, float]]:
    """(memcpy seconds, transfer seconds) of `repeats` requests (after one warm-up) from here to
    a receiver, each transfer paired with a memcpy of the same bytes timed next to it."""
    loop = asyncio.get_running_loop()
    sender_pool = case.make_pool()
    runs = coalesce_runs(case.src_ids, case.dst_ids)
    memcpy = MemcpyTimer(case.num_bytes)
    if backend == "loopback":
        hub = LoopbackHub()
        receiver = create_transport(backend, case.make_pool(), instance_id="decode", hub=hub, **options)
        sender = create_transport(backend, sender_pool, instance_id="prefill", hub=hub, **options)
        await receiver.start()
        await sender.start()
        description, process, conn = receiver.describe(), None, None
    else:
        context = multiprocessing.get_context("spawn")
        conn, child = context.Pipe()
        process = context.Process(target=_receiver_main, args=(child, backend, case, options), daemon=True)
        process.start()
        description = await asyncio.wait_for(loop.run_in_executor(None, conn.recv), START_TIMEOUT_S)
        sender = create_transport(backend, sender_pool, instance_id="prefill", **options)
        await sender.start()
    peer = await sender.connect(description)

    async def transfer(request_id: str) -> float:
        if process is None:
            receiver.expect(request_id, "prefill", case.dst_ids)
        else:
            conn.send(request_id)
            await loop.run_in_executor(None, conn.recv)
        start = time.monotonic()
        for layer in range(NUM_LAYERS):
            sender.write_layer(peer, request_id, layer, runs)
        await sender.finish_request(peer, request_id)
        if process is None:
            await receiver.wait_landed(request_id, timeout=LANDED_TIMEOUT_S)
            return time.monotonic() - start
        end = await asyncio.wait_for(loop.run_in_executor(None, conn.recv), LANDED_TIMEOUT_S)
        return end - start

    pairs = []
    try:
        for rep in range(repeats + 1):
            # Whichever copy runs second pays for the dirty cache lines the first left behind,
            # so the order alternates. The receiver idles during the memcpy.
            memcpy_first = rep % 2 == 0
            memcpy_s = memcpy.seconds() if memcpy_first else 0.0
            transfer_s = await transfer(f"{case.name}-{rep}")
            memcpy_s = memcpy_s if memcpy_first else memcpy.seconds()
            if rep:  # the first round warms up
                pairs.append((memcpy_s, transfer_s))
    finally:
        await sender.close()
        if process is None:
            await receiver.close()
        else:
            conn.send(None)
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return pairs


def _sender_main(conn, backend: str, case: Case, repeats: int, options: dict) -> None:
    logging.basicConfig(level=logging.WARNING)
    import uvloop

    conn.send(uvloop.run(_measure(backend, case, repeats, options)))


def measure_in_process(backend: str, case: Case, repeats: int, options: dict) -> list[tuple[float, float]]:
    """Run `_measure` in a fresh process: each backend gets a clean environment (importing
    ucxx sets UCX_RNDV_THRESH, which would slow NIXL's UCX in the same process), as it would
    in a real instance that uses one transport."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_sender_main, args=(child, backend, case, repeats, options))
    process.start()
    try:
        if not parent.poll(START_TIMEOUT_S + LANDED_TIMEOUT_S * (repeats + 1)):
            raise TimeoutError(f"{backend} {case.name}: no result")
        return parent.recv()
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    request_bytes = args.request_mib * MIB
    installed = set(available_transports())
    backends = [b for b in args.backends.split(",") if b in installed]
    options = {"link_gbps": args.link_gbps} if args.link_gbps else {}
    large = Case("1mib", LARGE_BLOCK_SHAPE, request_bytes, chunk_blocks=1, seed=1)
    small = Case("small", TINY_BLOCK_SHAPE, request_bytes, chunk_blocks=args.small_chunk_blocks, seed=2)
    result = {
        "request_bytes": request_bytes,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "memcpy_gbps": None,
        "raw_socket_gbps": None,
        "link_gbps": args.link_gbps,
        "cases": {
            c.name: {"block_bytes": int(np.prod(c.block_shape)) * 4, "runs_per_layer": c.num_runs}
            for c in (large, small)
        },
        "backends": {},
        "backends_small_blocks": {},
        "skipped": sorted(set(args.backends.split(",")) - installed),
    }
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    raw_rates = []
    for _ in range(args.rounds):
        raw_rates.append(raw_socket_gbps(request_bytes, args.repeats))
        for backend in backends:
            for case in (large, small):
                pairs.setdefault((backend, case.name), []).extend(
                    measure_in_process(backend, case, args.repeats, options)
                )
    raw = result["raw_socket_gbps"] = statistics.median(raw_rates)
    memcpy_s_per_byte = []
    for backend in backends:
        for case, key in ((large, "backends"), (small, "backends_small_blocks")):
            measured = pairs[backend, case.name]
            memcpy_s_per_byte += [memcpy_s / case.num_bytes for memcpy_s, _ in measured]
            gbps = case.num_bytes / statistics.median(t for _, t in measured) / GBIT
            ratios = [m / t for m, t in measured]
            result[key][backend] = {
                "gbps": gbps,
                "memcpy_gbps": case.num_bytes / statistics.median(m for m, _ in measured) / GBIT,
                "ratio_to_memcpy": statistics.median(ratios),
                "ratio_to_memcpy_per_round": [
                    statistics.median(ratios[i : i + args.repeats]) for i in range(0, len(ratios), args.repeats)
                ],
                "ratio_to_raw_socket": gbps / raw,
            }
    if memcpy_s_per_byte:
        result["memcpy_gbps"] = 1 / statistics.median(memcpy_s_per_byte) / GBIT
    return result


TARGETS = {"loopback": ("memcpy", 0.8), "tcp": ("raw socket", 0.9), "ucx": ("memcpy", 0.7), "nixl": ("memcpy", 0.5)}
SMALL_BLOCK_TARGET = 0.5  # small-block runs within 2x of 1 MiB runs


def print_table(result: dict) -> None:
    memcpy = "n/a" if result["memcpy_gbps"] is None else f"{result['memcpy_gbps']:.1f} Gbit/s"
    print(
        f"request {result['request_bytes'] // MIB} MiB, median of {result['rounds']} rounds x {result['repeats']}; "
        f"memcpy {memcpy} (paired with every repetition), raw socket {result['raw_socket_gbps']:.1f} Gbit/s"
    )
    print(
        f"{'backend':<10}{'1MiB Gbit/s':>12}{'/memcpy':>9}{'/socket':>9}{'target':>22}"
        f"{'small Gbit/s':>14}{'small/1MiB':>12}   /memcpy by round"
    )
    for backend, large in result["backends"].items():
        small = result["backends_small_blocks"][backend]
        baseline, ratio = TARGETS[backend]
        got = large["ratio_to_memcpy"] if baseline == "memcpy" else large["ratio_to_raw_socket"]
        verdict = "ok" if got >= ratio else "MISS"
        share = small["gbps"] / large["gbps"]
        print(
            f"{backend:<10}{large['gbps']:>12.1f}{large['ratio_to_memcpy']:>9.2f}{large['ratio_to_raw_socket']:>9.2f}"
            f"{f'>={ratio} {baseline} {verdict}':>22}{small['gbps']:>14.1f}"
            f"{share:>8.2f} {'ok' if share >= SMALL_BLOCK_TARGET else 'MISS':<4}   "
            + " ".join(f"{r:.2f}" for r in large["ratio_to_memcpy_per_round"])
        )
    if result["skipped"]:
        print(f"skipped (not installed): {', '.join(result['skipped'])}")
