"""The prefix-cache poisoning, reproduced as it was found (`kv_attack.py`): with a cluster
secret none of its steps gets through and a later request sharing the prefix is untouched;
without one (the documented risk of running with no secret) the same attack still works,
which is also what shows that the attack is real."""

from __future__ import annotations

import random

import msgspec
import pytest
import torch
from engine_helpers import complete
from kv_attack import poison_prefix
from tcp_cluster import BLOCK_SIZE, CONFIG, SECRET, TcpCluster

from minipd.engine.sampling_params import SamplingParams

PREFIX_BLOCKS = 2  # the 32-token prefix
MAX_TOKENS = 16
ATTACK_TIMEOUT_S = 180.0  # the cluster's start included, on a loaded machine


def _prompts() -> tuple[list[int], list[int]]:
    rng = random.Random(13)
    prefix = [rng.randrange(256) for _ in range(PREFIX_BLOCKS * BLOCK_SIZE)]
    return prefix + [7], prefix + [rng.randrange(256) for _ in range(20)]


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(make_engine):
    """What the legitimate request must produce: a colocated engine that nobody attacked."""
    return make_engine(**msgspec.structs.asdict(CONFIG))


async def _attack_then_serve(cluster: TcpCluster, attack_prompt: list[int], legit_prompt: list[int]):
    pool = cluster.decode.engine.kv_pool
    num_layers, block_bytes = pool.shape[0], pool[0, 0].numel() * pool.element_size()
    before = pool.clone()
    report = await poison_prefix(
        ("127.0.0.1", cluster.decode.port), cluster.kv_address(), attack_prompt, num_layers, block_bytes
    )
    pool_untouched = torch.equal(before.view(torch.uint8), pool.view(torch.uint8))
    outputs = [o async for o in cluster.router.generate(legit_prompt, GREEDY)]
    await cluster.assert_pools_free()
    return report, pool_untouched, outputs


def _tokens(outputs) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


def test_with_a_secret_the_attack_gets_nowhere_and_the_cache_stays_clean(loop_thread, reference):
    attack_prompt, legit_prompt = _prompts()
    expected = loop_thread.run(complete(reference, legit_prompt, GREEDY))

    async def run():
        cluster = await TcpCluster.start(SECRET)
        try:
            return await _attack_then_serve(cluster, attack_prompt, legit_prompt)
        finally:
            await cluster.close()

    report, pool_untouched, outputs = loop_thread.run(run(), timeout=ATTACK_TIMEOUT_S)
    assert not report.welcomed and report.first_reply == "CallError", "a Hello without the secret must be refused"
    assert report.reserved is None, "an unauthenticated process reserved blocks"
    assert report.kv_answers[0] == "challenge", "the KV port must challenge a new link"
    assert report.kv_answers[1].startswith("refused: the sender has no cluster secret"), report.kv_answers
    assert pool_untouched, "an unauthenticated process wrote into the decode pool"
    assert report.adopted_tokens == [], "decode adopted KV from an unauthenticated process"
    last = outputs[-1]
    assert last.error is None and last.transfer is not None
    assert last.transfer.decode_cached_tokens == 0 and last.num_cached_tokens == 0, "poisoned prefix-cache hit"
    assert _tokens(outputs) == expected.token_ids


def test_without_a_secret_the_same_attack_poisons_the_cache(loop_thread, reference):
    attack_prompt, legit_prompt = _prompts()
    expected = loop_thread.run(complete(reference, legit_prompt, GREEDY))

    async def run():
        cluster = await TcpCluster.start(None)
        try:
            return await _attack_then_serve(cluster, attack_prompt, legit_prompt)
        finally:
            await cluster.close()

    report, pool_untouched, outputs = loop_thread.run(run(), timeout=ATTACK_TIMEOUT_S)
    assert report.welcomed and report.reserved is not None and report.adopted_tokens and not pool_untouched
    last = outputs[-1]
    assert last.transfer.decode_cached_tokens == PREFIX_BLOCKS * BLOCK_SIZE, "the garbage was not cached"
    assert _tokens(outputs) != expected.token_ids, "the poisoned prefix did not change the output"
