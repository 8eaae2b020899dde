"""The router's prefix index in a running cluster (two prefill instances, one decode): it learns
what each instance's prefix cache holds from their KV events, so when the instance that
prefilled a prompt evicts it, the next prompt with that prefix goes to the instance that still
holds part of it, not to the one the router last sent it to."""

from __future__ import annotations

from disagg_helpers import BLOCK_SIZE, two_prefill_cluster

from minipd.engine.sampling_params import SamplingParams

WAIT_S = 10.0
GREEDY = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
BASE = list(range(100, 100 + 5 * BLOCK_SIZE))  # five full blocks


async def _transfer(cluster, prompt):
    outputs = [o async for o in cluster.generate(prompt, GREEDY)]
    return outputs[-1].transfer


def test_an_eviction_moves_the_prefill_to_the_instance_still_holding_the_prefix(loop_thread):
    async def run():
        async with await two_prefill_cluster() as cluster:
            registry = cluster.router.registry
            index, hashes = registry.prefix_index, registry.prompt_hashes(BASE)
            first = await _transfer(cluster, BASE + [50] * 20)
            holder = first.prefill_instance
            other = next(i for i in ("prefill-0", "prefill-1") if i != holder)
            held = await index.wait_until(lambda: index.local_match(holder, hashes) == 5, WAIT_S)

            # the other instance computes three blocks of the prefix itself (not through the router)
            async for _ in cluster.instance(other).engine.generate(BASE[: 3 * BLOCK_SIZE] + [7] * 10, GREEDY):
                pass
            partly = await index.wait_until(lambda: index.local_match(other, hashes) == 3, WAIT_S)
            again = await _transfer(cluster, BASE + [51] * 20)

            # the holder's pool is taken whole and given back: every cached block there is evicted
            engine = cluster.instance(holder).engine
            assert await engine.wait_idle(WAIT_S)
            engine.block_manager.free(engine.block_manager.reserve(engine.block_manager.num_free_blocks))
            evicted = await index.wait_until(lambda: index.local_match(holder, hashes) == 0, WAIT_S)
            after = await _transfer(cluster, BASE + [52] * 20)
            return holder, other, (held, partly, evicted), again, after

    holder, other, waits, again, after = loop_thread.run(run())
    assert waits == (True, True, True), "the index follows each instance's cache"
    assert again.prefill_instance == holder and again.prefill_cached_tokens == 5 * BLOCK_SIZE
    assert after.prefill_instance == other, "after the eviction, the instance still holding the prefix"
    assert after.prefill_cached_tokens == 3 * BLOCK_SIZE
