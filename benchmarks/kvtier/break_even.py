"""Fetch against recompute, over the prefix length: part of `python bench.py kvtier-ops`.

For each model (`--models`) one engine (`--torch-threads` threads, as the `kvtier` benches' instances have),
and for each prefix of `n` tokens (`--lengths`, whole blocks) a prompt of `n` tokens and a tail of
`--tail-tokens` of its own, new every round, answered with one token; its TTFT measured three ways:

- `recompute`: the pool empty, every prompt token computed (what the tier saves from);
- `local`: the prefix already in the engine's prefix cache (computed by a request before), the tail
  computed: `recompute - local` is what computing the prefix costs, `compute_ms`;
- for each store: the prefix in the tier (stored by a request before, the pool emptied since),
  fetched before the request as an instance does it (disagg/tier_wire.py: lookup, fetch, register):
  `fetch_ms` is that fetch's time, `tier_ms` the whole TTFT, fetch included.

The break-even `n` of a store is the shortest measured prefix from which the fetch beats computing
(`fetch_ms < compute_ms` there and at every longer one; null if none). Each figure is the median over
`--break-even-rounds` rounds. The same run also reports what the instances' own choice learned from it
(kvtier/fetch_cost.py, fed every step and fetch here): its lines and its predicted break-even, in
blocks, next to the measured one.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time

from minipd.disagg.fingerprint import engine_fingerprint, kv_tier_digest
from minipd.disagg.tier_wire import TierWire
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.sampling_params import SamplingParams
from minipd.kvtier.fetch_cost import Always
from minipd.kvtier.open_tier import open_kv_tier
from minipd.kvtier.pool_buffers import pool_buffer
from minipd.kvtier.tier import TierSettings

BLOCK_SIZE = 16
SETTINGS = TierSettings(timeout_s=30.0, setup_timeout_s=60.0, max_store_bytes_in_flight=4 << 30)
DRAIN_S = 60.0
FIRST_TOKEN = 3  # below it, the tokenizers' special ids


def add_arguments(parser) -> None:
    parser.add_argument(
        "--models",
        default="tiny,smollm2",
        help="fetch vs recompute: comma-separated models, '' for none (default: %(default)s)",
    )
    parser.add_argument(
        "--lengths",
        default="16,32,64,128,256,512",
        help="prefix lengths in tokens, whole blocks (default: %(default)s)",
    )
    parser.add_argument("--tail-tokens", type=int, default=16, help="a prompt's own tail (default: %(default)s)")
    parser.add_argument("--break-even-rounds", type=int, default=5, help="(default: %(default)s)")
    parser.add_argument("--torch-threads", type=int, default=1, help="the engine's (default: %(default)s)")


def parse_lengths(text: str) -> list[int]:
    lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    if not lengths or any(n <= 0 or n % BLOCK_SIZE for n in lengths):
        raise ValueError(f"--lengths: positive multiples of the block size, {BLOCK_SIZE}")
    return lengths


def measure(models: list[str], lengths: list[int], urls: dict[str, str], args) -> dict:
    """Per model: the measured figures, per store the break-even, and the choice's own lines."""
    return {model: asyncio.run(_measure_model(model, lengths, urls, args)) for model in models}


async def _measure_model(model: str, lengths: list[int], urls: dict[str, str], args) -> dict:
    longest = lengths[-1] + args.tail_tokens
    config = EngineConfig.of(
        model=model,
        dtype="float32" if model == "tiny" else "auto",
        block_size=BLOCK_SIZE,
        num_blocks=2 * (longest // BLOCK_SIZE + 2),
        max_model_len=longest + 8,
        torch_threads=args.torch_threads,
    )
    engine = Engine(config)
    rng = random.Random(f"break-even-{model}")
    vocab = min(engine.model_config.vocab_size, 32000)
    rounds: dict[str, dict[int, list[float]]] = {}

    def record(name: str, n: int, seconds: float) -> None:
        rounds.setdefault(name, {}).setdefault(n, []).append(seconds * 1e3)

    async with engine:
        wires = await _wires(engine, urls)
        try:
            await _ttft(engine, _prompt(rng, vocab, 64))  # warm up the model's kernels
            for _ in range(args.break_even_rounds):
                for n in lengths:
                    prompt = _prompt(rng, vocab, n + args.tail_tokens)
                    engine.reset_pool()
                    record("recompute", n, await _ttft(engine, prompt))
                    record("local", n, await _ttft(engine, prompt[:n] + _prompt(rng, vocab, args.tail_tokens)))
                    for store, wire in wires.items():
                        stored = _prompt(rng, vocab, n + args.tail_tokens)
                        engine.on_finished = wire._store_finished  # this request alone is stored
                        await _ttft(engine, stored)  # computed and stored by an earlier request
                        engine.on_finished = None
                        if not await wire.drain(DRAIN_S):
                            raise RuntimeError(f"{store}: a store ran past {DRAIN_S} s")
                        engine.reset_pool()
                        prompt = stored[:n] + _prompt(rng, vocab, args.tail_tokens)
                        start = time.perf_counter()
                        fetched = await wire.prefetch(prompt)
                        fetch_s = time.perf_counter() - start
                        ttft = await _ttft(engine, prompt)
                        if fetched != n:
                            raise RuntimeError(f"{store}: fetched {fetched} of a {n}-token prefix")
                        record(f"fetch:{store}", n, fetch_s)
                        record(f"tier:{store}", n, fetch_s + ttft)
            learned = {store: wire.cost.lines() for store, wire in wires.items()}
        finally:
            for wire in wires.values():
                await wire.close()
        block_bytes = next(iter(wires.values())).block_bytes if wires else None
    return _summary(model, lengths, rounds, learned, block_bytes, str(engine.config.dtype))


async def _wires(engine: Engine, urls: dict[str, str]) -> dict[str, TierWire]:
    """One wire a store; each fetches whatever its tier has (`Always`, which learns the lines all
    the same) and sees every step; nothing is stored unless the bench says so (`on_finished`), so
    no store runs beside a measurement."""
    digest = kv_tier_digest(engine_fingerprint(engine))
    wires = {}
    for store, url in urls.items():
        tier = await open_kv_tier(url, digest, BLOCK_SIZE, SETTINGS)
        await tier.register(pool_buffer(engine.kv_pool))
        wire = TierWire(engine, tier)
        wire.cost = Always(wire.block_bytes, BLOCK_SIZE)
        wires[store] = wire
    every = list(wires.values())
    engine.on_step = lambda *step: [w._observe_step(*step) for w in every]
    engine.on_finished = None
    return wires


async def _ttft(engine: Engine, prompt: list[int]) -> float:
    start = time.perf_counter()
    async for _ in engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)):
        pass
    return time.perf_counter() - start


def _prompt(rng: random.Random, vocab: int, length: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN, vocab) for _ in range(length)]


def _summary(model, lengths, rounds, learned, block_bytes, dtype) -> dict:
    med = {name: [statistics.median(by_n[n]) for n in lengths] for name, by_n in rounds.items()}
    compute = [max(0.0, r - loc) for r, loc in zip(med["recompute"], med["local"])]
    stores = {}
    for name in med:
        if not name.startswith("fetch:"):
            continue
        store = name.split(":", 1)[1]
        fetch = med[name]
        lines = learned[store]
        stores[store] = {
            "fetch_ms": fetch,
            "tier_ms": med[f"tier:{store}"],
            "fetch_to_compute": [f / c if c > 0 else None for f, c in zip(fetch, compute)],
            "break_even_tokens": _break_even(lengths, fetch, compute),
            "model": {
                "lookup_ms": lines.lookup_s * 1e3,
                "fetch_latency_ms": lines.fetch_latency_s * 1e3,
                "fetch_mb_per_s": lines.fetch_bytes_per_s / 1e6,
                "token_ms": lines.token_s * 1e3,
                "break_even_tokens": _tokens(lines.break_even_blocks(block_bytes, BLOCK_SIZE)),
                "break_even_tokens_fetch_only": _tokens(lines.break_even_blocks(block_bytes, BLOCK_SIZE, lookup=False)),
            },
        }
    return {
        "dtype": dtype,
        "block_bytes": block_bytes,
        "lengths": lengths,
        "recompute_ms": med["recompute"],
        "local_ms": med["local"],
        "compute_ms": compute,
        "stores": stores,
    }


def _break_even(lengths: list[int], fetch: list[float], compute: list[float]) -> int | None:
    """The shortest length from which the fetch is faster at every measured longer one too."""
    best = None
    for n, f, c in reversed(list(zip(lengths, fetch, compute))):
        if f >= c:
            break
        best = n
    return best


def _tokens(blocks: float) -> float | None:
    """A predicted break-even in blocks as tokens (a fetch moves whole blocks: any prefix up to one
    block's tokens is one block); None: never."""
    return None if math.isinf(blocks) else round(blocks * BLOCK_SIZE, 1)


def print_table(result: dict) -> None:
    for model, m in result.items():
        print(f"fetch vs recompute, {model} ({m['dtype']}, {m['block_bytes']} bytes of KV a block of {BLOCK_SIZE})")
        head = "".join(f"{n:>9}" for n in m["lengths"])
        print(f"  {'prefix tokens':24}{head}")
        print(f"  {'compute ms':24}" + "".join(f"{v:9.2f}" for v in m["compute_ms"]))
        for store, s in m["stores"].items():
            print(f"  {store + ' fetch ms':24}" + "".join(f"{v:9.2f}" for v in s["fetch_ms"]))
        print(f"  {'TTFT recompute ms':24}" + "".join(f"{v:9.1f}" for v in m["recompute_ms"]))
        for store, s in m["stores"].items():
            print(f"  {'TTFT ' + store + ' ms':24}" + "".join(f"{v:9.1f}" for v in s["tier_ms"]))
        for store, s in m["stores"].items():
            pred = s["model"]
            print(
                f"  {store}: break-even measured {s['break_even_tokens']} tokens, predicted "
                f"{pred['break_even_tokens']} (lookup {pred['lookup_ms']:.2f} ms, fetch "
                f"{pred['fetch_latency_ms']:.2f} ms + {pred['fetch_mb_per_s']:.0f} MB/s, compute "
                f"{pred['token_ms']:.3f} ms a token)"
            )


def plot_model(ax, model: str, m: dict) -> None:
    """Compute and each store's fetch over the prefix length, log-log, the measured break-evens marked."""
    ax.plot(m["lengths"], m["compute_ms"], "k-o", label="compute the prefix")
    for store, s in m["stores"].items():
        (line,) = ax.plot(m["lengths"], s["fetch_ms"], "--o", label=f"fetch from {store}")
        if s["break_even_tokens"] is not None:
            ax.axvline(s["break_even_tokens"], color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prefix tokens")
    ax.set_ylabel("milliseconds (median)")
    ax.set_title(f"fetch vs recompute, {model} ({m['dtype']})")
    ax.legend(fontsize=8)
