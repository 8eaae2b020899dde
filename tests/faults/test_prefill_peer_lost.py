"""A prefill instance stops computing for a decode instance it is told is lost.

As it was found: after the router reported a decode instance lost (`PeerLost`), the prefill
instance went on computing every prompt queued for it, logging a traceback per layer per
request as each layer's KV had nowhere to go.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from minipd.engine.engine import EngineConfig
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig

CONFIG = EngineConfig.of(model="tiny", dtype="float32", num_blocks=256, max_model_len=512, max_num_batched_tokens=16)
NUM_PROMPTS = 6
PROMPT_TOKENS = 200  # 13 steps of 16 tokens each on the prefill instance: 78 steps queued in all
STEPS_BEFORE_LOSS = 3
SETTLE_TIMEOUT_S = 30.0


def test_prefills_for_a_lost_decode_instance_are_aborted_at_once(loop_thread, caplog):
    async def run():
        cluster = await InProcessCluster.start(CONFIG, 1, 1, RouterConfig(local_prefill_max_tokens=0))
        prefill, decode = cluster.instance("prefill-0"), cluster.instance("decode-0")
        loop = asyncio.get_running_loop()
        steps: list[int] = []  # prefill steps, in order; `lost_at`: how many had run when PeerLost came
        lost_at: list[int] = []
        steps_lock = threading.Lock()
        mid_prefill = asyncio.Event()
        execute, peer_lost = prefill.engine.runner.execute, prefill.transport.peer_lost

        def counting(chunks, hook=None):
            with steps_lock:
                steps.append(len(chunks))
                if len(steps) == STEPS_BEFORE_LOSS:
                    loop.call_soon_threadsafe(mid_prefill.set)
            return execute(chunks, hook)

        def noting_loss(instance_id, reason, *fenced):
            lost_at.append(len(steps))
            return peer_lost(instance_id, reason, *fenced)

        prefill.engine.runner.execute = counting
        prefill.transport.peer_lost = noting_loss
        try:
            params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

            async def one(k):
                return [o async for o in cluster.generate([k + 1] * PROMPT_TOKENS, params)]

            requests = [loop.create_task(one(k)) for k in range(NUM_PROMPTS)]
            await asyncio.wait_for(mid_prefill.wait(), SETTLE_TIMEOUT_S)
            await decode.close()  # its control connection drops: the router tells the prefill instance
            cluster.instances.remove(decode)
            results = await asyncio.wait_for(asyncio.gather(*requests), SETTLE_TIMEOUT_S)
            assert await prefill.engine.wait_idle(SETTLE_TIMEOUT_S)
            return results, list(steps), lost_at, prefill.stats()
        finally:
            await cluster.close()

    with caplog.at_level(logging.INFO):
        results, steps, lost_at, stats = loop_thread.run(run(), timeout=SETTLE_TIMEOUT_S * 3)
    assert lost_at, "the prefill instance was never told"
    assert len(steps) - lost_at[0] <= 1, f"{len(steps) - lost_at[0]} prefill steps ran after the loss"
    assert stats.num_running == stats.num_waiting == 0 and stats.num_used_blocks == 0, stats
    assert all(r[-1].error is not None and r[-1].num_output_tokens == 0 for r in results)
    layer_failures = [r for r in caplog.records if "KV sink failed on layer" in r.getMessage()]
    assert layer_failures == []
