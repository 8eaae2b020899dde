"""`python bench.py kvtier --trace FILE`: a window of the Mooncake conversation trace replayed
through several instances, without and with the shared KV tier.

The window (`--window` requests from `--start`) is scaled to the model (trace_window.py: each
512-token hash id becomes `--block-tokens` token ids, at most `--max-blocks` of them a prompt,
plus a 4-token tail of its own; answers capped at `--answer-tokens`) and sent open-loop at the
trace's arrival times divided by `--compress`. Both arms place request i on instance i mod n
(load spreading that ignores caches), with small pools (`--num-blocks`):

- `no_tier`: local prefix caches only;
- `tier`: every instance with the shared KV tier (disagg/tier_wire.py): a prefix computed on
  one instance is fetched on another.

Reported per arm: `hit_rate` (prompt tokens found in a cache, the tier's included, of every
prompt token), `hit_rate_local`, `hit_rate_tier`, `prefill_tokens_saved`,
`prefill_tokens_computed`, `ttft_p50_ms`, `ttft_p90_ms`; and `hit_rate_bound`: what an unbounded
cache holding every earlier request of the window would reuse, at the same scaling
(`bound_hit_tokens` of `prompt_tokens`). The top-level `hit_rate` is the tier arm's, and
`hit_rate_to_bound` their ratio. After the last request the tier's stores are drained before
the instances close; nothing waits for them during the replay.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from benchmarks.kvtier.bench_cluster import BLOCK_SIZE, default_store, instances, serve_one
from benchmarks.kvtier.kvtier_bench import redis_url
from benchmarks.kvtier.trace_window import Scaling, TraceRequest, bound_hit_blocks, read_window
from benchmarks.loadgen.processes import Processes
from minipd.disagg.tier_wire import TierWire
from minipd.engine.engine import Engine
from minipd.engine.sampling_params import SamplingParams

REPLAY_ARMS = ("no_tier", "tier")
TAIL_TOKENS = 4
DRAIN_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The replay's own flags (the instances' come from the multi-turn bench's)."""
    parser.add_argument("--trace", metavar="FILE", help="replay this Mooncake trace (JSONL) instead of the chat")
    parser.add_argument("--window", type=int, default=400, help="trace requests replayed (default: %(default)s)")
    parser.add_argument("--start", type=int, default=0, help="the window's first request (default: %(default)s)")
    parser.add_argument("--compress", type=float, default=2.0, help="trace time / replay time (default: %(default)s)")
    parser.add_argument("--block-tokens", type=int, default=32, help="token ids a hash id (default: %(default)s)")
    parser.add_argument("--max-blocks", type=int, default=8, help="hash ids a prompt at most (default: %(default)s)")


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        args.model, args.instances, args.num_blocks, args.answer_tokens = "tiny", 2, 64, 4
        args.window, args.compress, args.block_tokens, args.max_blocks = 200, 5.0, 16, 8
        args.kv_tier_fetch = "always"  # the tier's mechanics: tiny would rightly compute instead
    if min(args.window, args.block_tokens, args.max_blocks, args.instances) < 1 or args.compress <= 0:
        raise ValueError("--window, --block-tokens, --max-blocks, --instances and --compress must be positive")
    if args.block_tokens % BLOCK_SIZE:
        raise ValueError(f"--block-tokens: a multiple of the block size, {BLOCK_SIZE} (a hash id is whole blocks)")
    window = read_window(args.trace, args.start, args.window, args.max_blocks)
    bound_blocks = bound_hit_blocks(window)
    store = default_store(args.store)
    with Processes() as processes:
        url = redis_url(processes) if store == "redis" else None
        arms = {arm: asyncio.run(_run_arm(arm, args, window, url)) for arm in REPLAY_ARMS}
    prompt_tokens = len(window) * TAIL_TOKENS + sum(len(r.hash_ids) for r in window) * args.block_tokens
    bound_tokens = sum(bound_blocks) * args.block_tokens
    bound = bound_tokens / prompt_tokens
    checks = [
        f"{arm}: counted {m['prompt_tokens']} prompt tokens, not {prompt_tokens}"
        for arm, m in arms.items()
        if m["prompt_tokens"] != prompt_tokens
    ]
    return {
        "model": args.model,
        "store": store,
        "kv_tier_fetch": args.kv_tier_fetch,
        "instances": args.instances,
        "num_blocks": args.num_blocks,
        "trace": args.trace,
        "scaling": {
            "start": args.start,
            "window": args.window,
            "compress": args.compress,
            "block_tokens": args.block_tokens,
            "max_blocks": args.max_blocks,
            "tail_tokens": TAIL_TOKENS,
            "answer_tokens": args.answer_tokens,
        },
        "replay_seconds_trace": window[-1].arrival_s,
        "prompt_tokens": prompt_tokens,
        "bound_hit_tokens": bound_tokens,
        "hit_rate_bound": bound,
        "hit_rate": arms["tier"]["hit_rate"],
        "hit_rate_to_bound": arms["tier"]["hit_rate"] / bound if bound else None,
        "arms": arms,
        "checks_failed": checks,
    }


async def _run_arm(arm: str, args: argparse.Namespace, window: list[TraceRequest], url: str | None) -> dict:
    max_model_len = args.max_blocks * args.block_tokens + TAIL_TOKENS + args.answer_tokens + 8
    tier = arm == "tier"
    async with instances(
        args.model, args.num_blocks, max_model_len, args.instances, tier, url, args.kv_tier_fetch
    ) as cluster:
        return await _replay(args, window, *cluster)


async def _replay(args, window: list[TraceRequest], engines: list[Engine], wires: list[TierWire | None]) -> dict:
    scaling = Scaling(args.block_tokens, TAIL_TOKENS, min(engines[0].model_config.vocab_size, 32000))
    prompts = [scaling.prompt(r) for r in window]
    began = time.perf_counter()

    async def one(i: int, request: TraceRequest):
        # Open loop: each request leaves at its (compressed) arrival time, whatever came before.
        await asyncio.sleep(max(0.0, began + request.arrival_s / args.compress - time.perf_counter()))
        params = SamplingParams(
            max_tokens=max(1, min(request.output_tokens, args.answer_tokens)), temperature=0.0, ignore_eos=True
        )
        return await serve_one(engines[i % len(engines)], wires[i % len(engines)], prompts[i], params)

    served = await asyncio.gather(*(one(i, r) for i, r in enumerate(window)))
    for wire in wires:
        if wire is not None:
            await wire.drain(DRAIN_S)
    prompt, cached, fetched = sum(map(len, prompts)), sum(s.cached for s in served), sum(s.fetched for s in served)
    ttfts = [s.ttft_ms for s in served]
    return {
        "requests": len(served),
        "prompt_tokens": prompt,
        "prefill_tokens_saved": cached,
        "prefill_tokens_computed": prompt - cached,
        "hit_rate": cached / prompt,
        "hit_rate_local": (cached - fetched) / prompt,
        "hit_rate_tier": fetched / prompt,
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p90_ms": statistics.quantiles(ttfts, n=10)[-1] if len(ttfts) > 1 else ttfts[0],
        "replay_wall_s": time.perf_counter() - began,
    }


def print_table(result: dict) -> None:
    s = result["scaling"]
    print(
        f"trace replay: requests {s['start']}..{s['start'] + s['window'] - 1} of {result['trace']} "
        f"({result['replay_seconds_trace']:.0f} s of trace / {s['compress']:g}), a hash id = {s['block_tokens']} "
        f"tokens, at most {s['max_blocks']} a prompt, + {s['tail_tokens']}; {result['instances']} instances "
        f"of {result['num_blocks']} blocks, {result['model']}, store {result['store']} "
        f"(fetch: {result['kv_tier_fetch']})"
    )
    head = f"{'hit rate':>8} {'local':>6} {'tier':>6} {'saved':>7} {'computed':>8} {'TTFT p50':>9} {'p90':>7}"
    print(f"  {'arm':8} {head}")
    for arm, m in result["arms"].items():
        hits = f"{m['hit_rate']:8.3f} {m['hit_rate_local']:6.3f} {m['hit_rate_tier']:6.3f}"
        tokens = f"{m['prefill_tokens_saved']:7d} {m['prefill_tokens_computed']:8d}"
        print(f"  {arm:8} {hits} {tokens} {m['ttft_p50_ms']:9.0f} {m['ttft_p90_ms']:7.0f}")
    ratio = result["hit_rate_to_bound"]
    print(
        f"  unbounded-cache bound: {result['hit_rate_bound']:.3f} ({result['bound_hit_tokens']} of "
        f"{result['prompt_tokens']} prompt tokens); tier / bound: {ratio:.2f}"
        if ratio is not None
        else "  unbounded-cache bound: 0 (no prefix repeats in the window)"
    )
    for failure in result["checks_failed"]:
        print(f"  FAILED: {failure}")


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    arms = result["arms"]
    names = [*arms, "bound"]
    rates = [m["hit_rate"] for m in arms.values()] + [result["hit_rate_bound"]]
    left.bar(names, rates, color=["grey", "tab:green", "k"])
    left.set_ylabel("prefix hit rate (prompt tokens)")
    for x, arm in enumerate(arms):
        right.bar([x - 0.2, x + 0.2], [arms[arm]["ttft_p50_ms"], arms[arm]["ttft_p90_ms"]], width=0.4)
    right.set_xticks(range(len(arms)), list(arms))
    right.set_ylabel("TTFT p50 | p90 (ms)")
    s = result["scaling"]
    fig.suptitle(f"Mooncake trace, requests {s['start']}..{s['start'] + s['window'] - 1}, {result['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
