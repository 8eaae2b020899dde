"""A two-turn conversation over HTTP against a live prefill/decode cluster on `tiny` (float32,
block size 16) whose instances share a KV tier on a Redis (redis_server.py), built so that
its second turn is partly fetched from the tier.

Turn 1 (90 fresh tokens, 8 greedy tokens out) is prefilled on the prefill instance, which
stores its 5 full prompt blocks; the decode instance stores its prompt and generated tail: 6
blocks, the sixth made of the prompt's last 10 tokens and the first 6 generated. Turn 2 is
turn 1, its answer and 40 new tokens: prefilled remotely again (more uncached tokens than the
router's local-prefill bound), on the prefill instance, which finds the first 5 blocks in its
own prefix cache and fetches the sixth from the tier: 16 tier hit tokens, one fetch. The
answer's token ids come from a reference engine (`reference`: the same greedy tokens, as the
tier tests check), since the HTTP API gives text. Every wait is bounded.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from typing import Callable, NamedTuple

from redis_server import RedisServer

BLOCK_SIZE = 16
TURN1_TOKENS, MAX_TOKENS, NEW_TOKENS = 90, 8, 40
STORED_BLOCKS = (TURN1_TOKENS + MAX_TOKENS - 1) // BLOCK_SIZE  # the last generated token's KV is never computed
TIER_HIT_TOKENS = BLOCK_SIZE  # the sixth block
STORE_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 120.0


class Turn(NamedTuple):
    prompt: list[int]
    elapsed_s: float  # the whole request, as the client saw it


def complete(base_url: str, prompt: list[int], api_key: str | None = None, traceparent: str | None = None) -> Turn:
    """One greedy completion of MAX_TOKENS (ignore_eos) of token ids; asserts it finished."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if traceparent:
        headers["traceparent"] = traceparent
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(f"{base_url}/v1/completions", json.dumps(body).encode(), headers)
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        answer = json.load(response)
    assert answer["choices"][0]["finish_reason"] == "length", answer
    return Turn(prompt, time.monotonic() - started)


def wait_for_keys(redis: RedisServer, count: int, timeout_s: float = STORE_TIMEOUT_S) -> None:
    """Poll the store until it holds `count` keys (the stores run after the answer left)."""
    deadline = time.monotonic() + timeout_s
    while redis.dbsize() < count:
        assert time.monotonic() < deadline, f"{redis.dbsize()} keys in the store, not {count}, after {timeout_s} s"
        time.sleep(0.05)  # poll interval of a bounded wait


def turn_one(base_url: str, redis: RedisServer, seed: int, **options) -> tuple[Turn, int]:
    """Turn 1, once every block it stores is in the store; (the turn, the store's keys before)."""
    keys = redis.dbsize()
    prompt = [random.Random(seed).randrange(256) for _ in range(TURN1_TOKENS)]
    turn = complete(base_url, prompt, **options)
    wait_for_keys(redis, keys + STORED_BLOCKS)
    return turn, keys


def turn_two(base_url: str, first: Turn, reference: Callable[[list[int]], list[int]], seed: int, **options) -> Turn:
    """Turn 1's prompt, its answer (from `reference`) and NEW_TOKENS fresh tokens."""
    rng = random.Random(seed + 1)
    prompt = first.prompt + reference(first.prompt) + [rng.randrange(256) for _ in range(NEW_TOKENS)]
    return complete(base_url, prompt, **options)


def reference_answer(make_engine, loop_thread) -> Callable[[list[int]], list[int]]:
    """The greedy MAX_TOKENS a `tiny` float32 engine of the cluster's kind answers a prompt with."""
    from engine_helpers import complete as engine_complete
    from engine_helpers import greedy

    engine = make_engine(model="tiny", dtype="float32")
    return lambda prompt: loop_thread.run(engine_complete(engine, prompt, greedy(MAX_TOKENS))).token_ids
