"""A process that serves prompts of many distinct lengths through one in-process bfloat16 engine
and prints its resident set before and after, as one JSON line (run by
tests/processes/test_bounded_memory.py, one process per measure, so that no other engine or
test shares the memory it reads).

    python engine_rss_workload.py MODEL NUM_REQUESTS NUM_LENGTHS

The kernel caches' capacities come from the environment the test gives it. Prints
{"rss_start_mb", "rss_end_mb", "tokens"}: the resident set after one warm-up request and
after all, and every request's greedy tokens, in order.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

from engine_helpers import complete, greedy

from minipd.engine.engine import Engine, EngineConfig

FIRST_LENGTH = 20
MAX_TOKENS = 2
VOCAB = (10, 250)  # byte ids of the built-in presets' tokenizer


def vm_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


async def serve(model: str, num_requests: int, num_lengths: int) -> dict:
    engine = Engine(EngineConfig.of(model=model, dtype="bfloat16", max_model_len=1024, torch_threads=1))
    await engine.start()
    try:
        rng = random.Random(0)
        lengths = [FIRST_LENGTH + i % num_lengths for i in range(num_requests)]
        rng.shuffle(lengths)
        await complete(engine, [VOCAB[0]] * 8, greedy(MAX_TOKENS))
        start = vm_rss_mb()
        tokens = []
        for n in lengths:
            prompt = [rng.randrange(*VOCAB) for _ in range(n)]
            tokens.append((await complete(engine, prompt, greedy(MAX_TOKENS))).token_ids)
        return {"rss_start_mb": start, "rss_end_mb": vm_rss_mb(), "tokens": tokens}
    finally:
        await engine.close()


if __name__ == "__main__":
    model, num_requests, num_lengths = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(asyncio.run(serve(model, num_requests, num_lengths))))
