"""Shared pieces of the disaggregation tests: the prompt set, the engine config, and comparisons."""

from __future__ import annotations

import asyncio
import random

from engine_helpers import Completion

from minipd.engine.engine import EngineConfig
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig

BLOCK_SIZE = 16
LOCAL_PREFILL_MAX_TOKENS = 16
# float32 pinned: disaggregated and colocated outputs are compared token for token.
CONFIG = EngineConfig.of(
    model="tiny", dtype="float32", block_size=BLOCK_SIZE, num_blocks=256, max_model_len=512, max_num_batched_tokens=64
)
ENGINE_ARGV = [
    "--dtype",
    "float32",
    "--block-size",
    str(BLOCK_SIZE),
    "--num-blocks",
    "256",
    "--max-model-len",
    "512",
    "--max-num-batched-tokens",
    "64",
]
ROUTER_ARGV = ["--local-prefill-max-tokens", str(LOCAL_PREFILL_MAX_TOKENS)]
MAX_TOKENS = 10
SHARED_PREFIX_LEN = 3 * BLOCK_SIZE + 5


async def two_prefill_cluster() -> InProcessCluster:
    """Two prefill instances and one decode instance on CONFIG (prompts of at most
    LOCAL_PREFILL_MAX_TOKENS prefill on the decode instance); the caller closes it."""
    router_config = RouterConfig(local_prefill_max_tokens=LOCAL_PREFILL_MAX_TOKENS)
    return await InProcessCluster.start(CONFIG, num_prefill=2, num_decode=1, router_config=router_config)


def first_wave(seed: int = 0) -> list[list[int]]:
    """22 prompts of mixed lengths: short ones (prefilled on decode) and long ones (across blocks)."""
    rng = random.Random(seed)
    lengths = [3, 9, 14, 17, 20, 31, 33, 40, 47, 63, 64, 65, 80, 99, 100, 128, 129, 150, 170, 200, 240, 300]
    return [[rng.randrange(256) for _ in range(n)] for n in lengths]


def prefix_wave(seed: int = 1) -> tuple[list[int], list[list[int]]]:
    """A shared prefix sent first, then prompts extending it (prefix-cache hits on both sides)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(256) for _ in range(SHARED_PREFIX_LEN)]
    return prefix + [1, 2, 3], [prefix + [rng.randrange(256) for _ in range(n)] for n in (4, 20, 37)]


def params_for(kind: str, i: int) -> SamplingParams:
    if kind == "greedy":
        return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_k=50, seed=1000 + i, ignore_eos=True)


async def run_all(server, prompts: list[list[int]], kind: str) -> list[Completion]:
    """Every prompt at once through anything with `generate()`."""

    async def one(i: int, prompt: list[int]) -> Completion:
        return Completion([out async for out in server.generate(prompt, params_for(kind, i))])

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def assert_same_tokens(expected: list[Completion], actual: list[Completion], prompts: list[list[int]]) -> None:
    for e, a, prompt in zip(expected, actual, prompts):
        assert a.outputs[-1].error is None, a.outputs[-1].error
        assert a.token_ids == e.token_ids, f"prompt of {len(prompt)} tokens"
