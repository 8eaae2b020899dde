"""A process that serves prompts of random lengths, several at a time, through one in-process
engine of the machine's default dtype, and prints its resident set as it goes, as one JSON line
(run by tests/processes/test_bounded_memory.py, one process per measure, so that no other
engine or test shares the memory it reads).

    python engine_rss_workload.py MODEL NUM_REQUESTS CONCURRENCY MAX_PROMPT_LEN NUM_MARKS

What it serves is what an instance under a real load sees: prompts of up to MAX_PROMPT_LEN
tokens, CONCURRENCY at a time, so that prefill chunks of every size meet in batched steps. The
kernel caches' capacities come from the environment the test gives it. Prints {"dtype",
"rss_start_mb", "rss_marks_mb"}: the resident set after one warm-up request, and after each of
NUM_MARKS equal shares of the requests.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

from engine_helpers import complete, greedy

from minipd.engine.engine import Engine, EngineConfig

MIN_PROMPT_LEN = 20
MAX_TOKENS = 8
VOCAB = (10, 250)  # byte ids of the built-in presets' tokenizer


def vm_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


async def serve(model: str, num_requests: int, concurrency: int, max_prompt_len: int, num_marks: int) -> dict:
    engine = Engine(EngineConfig.of(model=model, max_model_len=1024, torch_threads=1))  # dtype: the machine's
    await engine.start()
    try:
        rng = random.Random(0)
        await complete(engine, [VOCAB[0]] * 8, greedy(2))
        start, marks, done = vm_rss_mb(), [], 0
        slots = asyncio.Semaphore(concurrency)
        every = num_requests // num_marks

        async def one() -> None:
            nonlocal done
            async with slots:
                prompt = [rng.randrange(*VOCAB) for _ in range(rng.randrange(MIN_PROMPT_LEN, max_prompt_len))]
                await complete(engine, prompt, greedy(rng.randrange(1, MAX_TOKENS)))
                done += 1
                if done % every == 0:
                    marks.append(vm_rss_mb())

        await asyncio.gather(*(one() for _ in range(num_requests)))
        return {"dtype": engine.config.dtype, "rss_start_mb": start, "rss_marks_mb": marks}
    finally:
        await engine.close()


if __name__ == "__main__":
    model, *numbers = sys.argv[1:]
    print(json.dumps(asyncio.run(serve(model, *map(int, numbers)))))
