"""What the shared KV tier's calls take on each store, for the blocks of one long prefix, against
memcpy of the same bytes measured in the same run.

    python bench.py kvtier-ops --json kvtier-ops.json --plot kvtier-ops.png

Each round stores `--blocks` new blocks of `--layers` runs of `--run-kib` KiB (the shape of a
layer-major pool's blocks, minipd/kvtier/pool_buffers.py), stores them again (all present:
a lookup, nothing sent), looks them up, fetches them into other buffers (checked bytes-exact,
else `checks_failed`) and removes them; each figure is the median over `--rounds` rounds. The
stores: `fake` (the in-process dict: the tier's own cost, its checksums and copies), `redis`
(Debian's redis-server started here on a free port) and `mooncake` (a mooncake_master started
here by minipd.kvtier.mooncake_master), each over TCP on this host; one whose software is
missing is reported as skipped, with the reason.

Then, on the same stores, fetch against recompute over the prefix length for each of `--models`
(break_even.py): the break-even prefix from which fetching it from each store beats computing
it, measured, beside the one the instances' fetch-or-recompute choice learns from the same run
(`break_even` in the JSON, one entry a model).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import os
import socket
import statistics
import time

import numpy as np

from benchmarks.kvtier import break_even
from benchmarks.loadgen.processes import Processes
from minipd.kvtier.mooncake_master import MooncakeMaster
from minipd.kvtier.open_tier import open_kv_tier
from minipd.kvtier.tier import KVTier, TierBlock, TierSettings

STORES = ("fake", "redis", "mooncake")
OPERATIONS = ("store", "store_again", "exists", "fetch")
REDIS_SERVER = "/usr/bin/redis-server"
READY_TIMEOUT_S = 30.0
BLOCK_SIZE = 16
MODEL = hashlib.blake2b(b"the kvtier bench's model", digest_size=16).digest()
SETTINGS = TierSettings(timeout_s=30.0, setup_timeout_s=60.0, max_store_bytes_in_flight=4 << 30)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated (default: %(default)s)")
    parser.add_argument("--blocks", type=int, default=64, help="blocks a round moves (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=4, help="runs a block has, one a layer (default: %(default)s)")
    parser.add_argument("--run-kib", type=int, default=32, help="KiB of one run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per store (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    break_even.add_arguments(parser)


def _missing(store: str) -> str | None:
    if store == "redis" and importlib.util.find_spec("redis") is None:
        return "redis (redis-py) is not installed: pip install -e '.[kvtier]'"
    if store == "redis" and not os.path.exists(REDIS_SERVER):
        return f"{REDIS_SERVER} is not installed"
    if store == "mooncake" and importlib.util.find_spec("mooncake") is None:
        return "mooncake is not installed: pip install -e '.[kvtier]'"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def redis_url(processes: Processes) -> str:
    port = _free_port()
    server = processes.start(
        "redis-server",
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
    )
    server.wait_for_line(lambda line: True if "Ready to accept connections" in line else None, READY_TIMEOUT_S)
    server.drain()
    return f"redis://127.0.0.1:{port}/0"


async def _round(tier: KVTier, seed: int, args: argparse.Namespace) -> tuple[dict[str, float], bool]:
    """One round's seconds per operation, and whether every block came back bytes-exact."""
    run_bytes = args.run_kib << 10
    source = np.random.default_rng(seed).integers(0, 256, (args.blocks, args.layers, run_bytes), dtype=np.uint8)
    dest = np.zeros_like(source)
    tokens = np.random.default_rng(seed).integers(0, 50_000, args.blocks * BLOCK_SIZE).tolist()
    keys = tier.keys(tokens)
    calls = {
        "store": lambda: tier.store([TierBlock(k, list(source[i])) for i, k in enumerate(keys)]),
        "store_again": lambda: tier.store([TierBlock(k, list(source[i])) for i, k in enumerate(keys)]),
        "exists": lambda: tier.exists(keys),
        "fetch": lambda: tier.fetch([TierBlock(k, list(dest[i])) for i, k in enumerate(keys)]),
    }
    seconds, results = {}, {}
    for name in OPERATIONS:
        started = time.perf_counter()
        results[name] = await calls[name]()
        seconds[name] = time.perf_counter() - started
    await tier.remove(keys)
    exact = (
        results["store"].stored == args.blocks
        and results["store_again"].present == args.blocks
        and results["exists"] == args.blocks
        and results["fetch"].leading == args.blocks
        and np.array_equal(dest, source)
    )
    return seconds, exact


async def _measure(url: str, args: argparse.Namespace) -> tuple[dict[str, list[float]], int]:
    tier = await open_kv_tier(url, MODEL, BLOCK_SIZE, SETTINGS)
    try:
        runs: dict[str, list[float]] = {name: [] for name in OPERATIONS}
        inexact = 0
        for r in range(args.rounds):
            seconds, exact = await _round(tier, 1000 + r, args)
            inexact += not exact
            for name, value in seconds.items():
                runs[name].append(value)
        return runs, inexact
    finally:
        await tier.close()


def _memcpy_s(nbytes: int, rounds: int) -> float:
    source, dest = np.ones(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)
    times = []
    for _ in range(max(rounds, 3)):
        started = time.perf_counter()
        np.copyto(dest, source)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        args.blocks, args.rounds = 16, 2
        args.models, args.lengths, args.break_even_rounds = "tiny", "16,64", 1
    models = [m for m in args.models.split(",") if m]
    lengths = break_even.parse_lengths(args.lengths)
    stores = [s for s in args.stores.split(",") if s]
    unknown = set(stores) - set(STORES)
    if unknown:
        raise ValueError(f"--stores: unknown {sorted(unknown)}; choose from {list(STORES)}")
    nbytes = args.blocks * args.layers * (args.run_kib << 10)
    memcpy_s = _memcpy_s(nbytes, args.rounds)
    result: dict = {
        "blocks": args.blocks,
        "layers": args.layers,
        "run_kib": args.run_kib,
        "rounds": args.rounds,
        "bytes_per_round": nbytes,
        "memcpy_ms": memcpy_s * 1e3,
        "stores": {},
        "skipped": {},
        "checks_failed": [],
    }
    master = MooncakeMaster()
    with Processes("minipd-kvtier-bench") as processes:
        try:
            urls = {}
            for store in stores:
                reason = _missing(store)
                if reason:
                    result["skipped"][store] = reason
                    continue
                if store == "mooncake":
                    master.start()
                urls[store] = {"fake": "fake://", "redis": None, "mooncake": master.url}[store] or redis_url(processes)
            for store, url in urls.items():
                _ops(store, url, args, nbytes, result)
            result["break_even"] = break_even.measure(models, lengths, urls, args)
        finally:
            master.stop()
    return result


def _ops(store: str, url: str, args: argparse.Namespace, nbytes: int, result: dict) -> None:
    """The calls on one store, into `result`."""
    runs, inexact = asyncio.run(_measure(url, args))
    if inexact:
        result["checks_failed"].append(f"{store}: {inexact} of {args.rounds} rounds not bytes-exact")
    medians = {f"{name}_ms": statistics.median(runs[name]) * 1e3 for name in OPERATIONS}
    result["stores"][store] = {
        **medians,
        "store_gbps": nbytes * 8 / (medians["store_ms"] * 1e6),
        "fetch_gbps": nbytes * 8 / (medians["fetch_ms"] * 1e6),
        "store_to_memcpy": medians["store_ms"] / result["memcpy_ms"],
        "fetch_to_memcpy": medians["fetch_ms"] / result["memcpy_ms"],
        "runs_ms": {name: [s * 1e3 for s in runs[name]] for name in OPERATIONS},
    }


def print_table(result: dict) -> None:
    mib = result["bytes_per_round"] / (1 << 20)
    print(
        f"the KV tier, {result['blocks']} blocks of {result['layers']} x {result['run_kib']} KiB "
        f"({mib:.0f} MiB), medians of {result['rounds']} rounds; memcpy of it: {result['memcpy_ms']:.2f} ms"
    )
    print(f"  {'store':10} {'store ms':>9} {'again ms':>9} {'exists ms':>10} {'fetch ms':>9} {'x memcpy':>17}")
    for name, m in result["stores"].items():
        ratios = f"{m['store_to_memcpy']:.0f} / {m['fetch_to_memcpy']:.0f}"
        print(
            f"  {name:10} {m['store_ms']:9.2f} {m['store_again_ms']:9.2f} {m['exists_ms']:10.2f} "
            f"{m['fetch_ms']:9.2f} {ratios:>17}"
        )
    for name, reason in result["skipped"].items():
        print(f"  {name:10} skipped: {reason}")
    for failure in result["checks_failed"]:
        print(f"  FAILED: {failure}")
    break_even.print_table(result.get("break_even", {}))


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stores = list(result["stores"])
    models = result.get("break_even", {})
    fig, axes = plt.subplots(1, 1 + len(models), figsize=(7 + 4.5 * len(models), 3.2), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / len(OPERATIONS)
    for i, name in enumerate(OPERATIONS):
        values = [result["stores"][s][f"{name}_ms"] for s in stores]
        ax.bar([x + i * width for x in range(len(stores))], values, width, label=name.replace("_", " "))
    ax.axhline(result["memcpy_ms"], color="grey", linestyle="--", label="memcpy of the same bytes")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(stores))], stores)
    ax.set_ylabel("milliseconds (median)")
    mib = result["bytes_per_round"] / (1 << 20)
    ax.set_title(f"the KV tier's calls, {result['blocks']} blocks ({mib:.0f} MiB)")
    ax.legend(fontsize=8)
    for ax, (model, m) in zip(axes[0][1:], models.items()):
        break_even.plot_model(ax, model, m)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
