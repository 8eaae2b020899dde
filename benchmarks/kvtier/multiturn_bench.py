"""`python bench.py kvtier`: the shared KV tier in the request path, on a multi-turn chat load.

N users, M rounds: every user's prompt is a shared system prompt, then its whole history (its
earlier messages and the answers it got), then a new message; each answer is greedy. Several
instances (engines with small pools, so no local cache can hold every user's history) serve
them; the bench places each request itself, as a router would, in three arms:

- `no_tier`: a user's next turn lands on another instance (round r of user u on instance
  (u + r) mod n: load spreading that ignores caches); local prefix caches only;
- `cache_aware`: every turn of a user on the same instance (u mod n); local caches only;
- `tier`: placed as `no_tier`, every instance with the shared KV tier (disagg/tier_wire.py):
  the history computed anywhere is fetched instead of computed.

Each round's requests go at once; the next round starts when they are answered and the tier's
background stores are through (a user types slower than a store). Reported per arm:
`prefill_tokens_computed` (prompt tokens not found in any cache), `ttft_p50_ms` and
`ttft_p90_ms` (one per round: submit to first token, the tier's fetch included),
`hit_rate_local` and `hit_rate_tier` (of every prompt token), and a check that every arm's
answers are the same tokens. The store: a local redis-server (`--store redis`, the default when
installed) or the in-process fake (`--store fake`: the tier's own cost only).

`python bench.py kvtier-ops` is the micro-benchmark of the tier's calls (kvtier_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics

from benchmarks.kvtier import replay_bench
from benchmarks.kvtier.bench_cluster import default_store, instances, serve_one
from benchmarks.kvtier.kvtier_bench import redis_url
from benchmarks.loadgen.processes import Processes
from minipd.disagg.tier_wire import TierWire
from minipd.engine.engine import Engine
from minipd.engine.sampling_params import SamplingParams
from minipd.kvtier.fetch_cost import KV_TIER_FETCH_CHOICES

ARMS = ("no_tier", "cache_aware", "tier")
DRAIN_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="the instances' model (default: %(default)s)")
    parser.add_argument("--users", type=int, default=8, help="(default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="(default: %(default)s)")
    parser.add_argument("--instances", type=int, default=3, help="(default: %(default)s)")
    parser.add_argument("--system-tokens", type=int, default=256, help="shared system prompt (default: %(default)s)")
    parser.add_argument("--message-tokens", type=int, default=64, help="each user message (default: %(default)s)")
    parser.add_argument("--answer-tokens", type=int, default=16, help="each answer (default: %(default)s)")
    parser.add_argument("--num-blocks", type=int, default=96, help="each instance's pool (default: %(default)s)")
    parser.add_argument("--store", choices=("redis", "fake"), default=None, help="(default: redis if installed)")
    parser.add_argument(
        "--kv-tier-fetch",
        choices=KV_TIER_FETCH_CHOICES,
        default="auto",
        help="the tier arm's fetch-or-recompute choice, as the instances' flag (default: %(default)s; "
        "--quick: always, since the tiny model computes a block faster than a store returns it)",
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (the tiny model)")
    replay_bench.add_arguments(parser)


def run(args: argparse.Namespace) -> dict:
    if args.trace:
        return replay_bench.run(args)
    if args.quick:
        args.model, args.users, args.rounds, args.instances = "tiny", 4, 3, 2
        args.system_tokens, args.message_tokens, args.answer_tokens, args.num_blocks = 64, 32, 8, 24
        args.kv_tier_fetch = "always"  # the tier's mechanics: tiny would rightly compute instead
    store = default_store(args.store)
    with Processes() as processes:
        url = redis_url(processes) if store == "redis" else None
        arms = {arm: asyncio.run(_run_arm(arm, args, url)) for arm in ARMS}
    # Answers are compared token for token where the numerics allow it: the tiny model in
    # float32 (as the tests do). A bfloat16 model's greedy tokens can change with the batch a
    # request runs in, tier or not (cache_aware differs from no_tier as much), so for it the
    # share of answers that match is reported, not checked.
    reference = arms["no_tier"]["answers"]
    same = {arm: _same_share(arms[arm].pop("answers"), reference) for arm in ARMS[1:]}
    arms["no_tier"].pop("answers")
    checks = [f"{arm}: answers differ from no_tier's" for arm in same if same[arm] < 1 and args.model == "tiny"]
    computed = {arm: arms[arm]["prefill_tokens_computed"] for arm in ARMS}
    return {
        "model": args.model,
        "store": store,
        "kv_tier_fetch": args.kv_tier_fetch,
        "users": args.users,
        "rounds": args.rounds,
        "instances": args.instances,
        "num_blocks": args.num_blocks,
        "arms": arms,
        "tier_to_no_tier_computed": computed["tier"] / max(1, computed["no_tier"]),
        "answers_same_as_no_tier": same,
        "checks_failed": checks,
    }


def _same_share(answers: list, reference: list) -> float:
    """The share of (user, round) answers whose tokens are those of `reference`."""
    return sum(a == b for a, b in zip(answers, reference)) / max(1, len(reference))


async def _run_arm(arm: str, args: argparse.Namespace, url: str | None) -> dict:
    max_model_len = args.system_tokens + args.rounds * (args.message_tokens + args.answer_tokens) + 8
    tier = arm == "tier"
    async with instances(
        args.model, args.num_blocks, max_model_len, args.instances, tier, url, args.kv_tier_fetch
    ) as cluster:
        return await _conversations(arm, args, *cluster)


async def _conversations(arm: str, args, engines: list[Engine], wires: list[TierWire | None]) -> dict:
    rng = random.Random(0)
    vocab = min(engines[0].model_config.vocab_size, 32000)
    system = [rng.randrange(3, vocab) for _ in range(args.system_tokens)]
    histories = [list(system) for _ in range(args.users)]
    params = SamplingParams(max_tokens=args.answer_tokens, temperature=0.0, ignore_eos=True)
    totals = dict.fromkeys(("prompt", "cached", "tier"), 0)
    p50, p90, answers = [], [], []

    async def turn(user: int, round_: int) -> float:
        index = user if arm == "cache_aware" else user + round_
        engine, wire = engines[index % len(engines)], wires[index % len(engines)]
        prompt = histories[user] + [rng.randrange(3, vocab) for _ in range(args.message_tokens)]
        served = await serve_one(engine, wire, prompt, params)
        histories[user] = prompt + served.tokens
        answers.append((user, round_, served.tokens))
        totals["prompt"] += len(prompt)
        totals["cached"] += served.cached
        totals["tier"] += served.fetched
        return served.ttft_ms

    for round_ in range(args.rounds):
        ttfts = await asyncio.gather(*(turn(u, round_) for u in range(args.users)))
        p50.append(statistics.median(ttfts))
        p90.append(statistics.quantiles(ttfts, n=10)[-1] if len(ttfts) > 1 else ttfts[0])
        for wire in wires:  # the next turn comes after the stores are through
            if wire is not None:
                await wire.drain(DRAIN_S)
    prompt = max(1, totals["prompt"])
    return {
        "prefill_tokens_computed": totals["prompt"] - totals["cached"],
        "prompt_tokens": totals["prompt"],
        "ttft_p50_ms": p50,
        "ttft_p90_ms": p90,
        "hit_rate_local": (totals["cached"] - totals["tier"]) / prompt,
        "hit_rate_tier": totals["tier"] / prompt,
        "answers": sorted(answers),
    }


def print_table(result: dict) -> None:
    if "hit_rate_bound" in result:
        return replay_bench.print_table(result)
    print(
        f"multi-turn: {result['users']} users x {result['rounds']} rounds on {result['instances']} instances "
        f"({result['num_blocks']} blocks each), {result['model']}, store {result['store']} "
        f"(fetch: {result['kv_tier_fetch']})"
    )
    print(f"  {'arm':12} {'computed':>9} {'local':>6} {'tier':>6}  TTFT p50 ms per round (p90)")
    for arm, m in result["arms"].items():
        rounds = "  ".join(f"{a:.0f} ({b:.0f})" for a, b in zip(m["ttft_p50_ms"], m["ttft_p90_ms"]))
        hits = f"{m['hit_rate_local']:6.2f} {m['hit_rate_tier']:6.2f}"
        print(f"  {arm:12} {m['prefill_tokens_computed']:9d} {hits}  {rounds}")
    print(f"  tier / no_tier prefill tokens computed: {result['tier_to_no_tier_computed']:.2f}")
    same = ", ".join(f"{arm} {share:.0%}" for arm, share in result["answers_same_as_no_tier"].items())
    print(f"  answers the same tokens as no_tier's: {same}")
    for failure in result["checks_failed"]:
        print(f"  FAILED: {failure}")


def plot(result: dict, path: str) -> None:
    if "hit_rate_bound" in result:
        return replay_bench.plot(result, path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    arms = result["arms"]
    left.bar(list(arms), [m["prefill_tokens_computed"] for m in arms.values()], color=["grey", "tab:blue", "tab:green"])
    left.set_ylabel("prompt tokens computed")
    for arm, m in arms.items():
        right.plot(range(1, len(m["ttft_p50_ms"]) + 1), m["ttft_p50_ms"], marker="o", label=arm)
    right.set_xlabel("round")
    right.set_ylabel("TTFT p50 (ms)")
    right.legend(fontsize=8)
    fig.suptitle(f"multi-turn chat, {result['users']} users on {result['instances']} instances ({result['model']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
