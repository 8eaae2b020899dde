"""The phases a disaggregated request reports are timed finely on the loop minipd serves on.

`minipd` runs its processes on uvloop, whose `loop.time()` counts whole milliseconds (libuv's
cached `uv_now`): a duration taken from it reads 0 for anything shorter, and a loopback reserve
or a prefill of the tiny model often is. This cluster runs on uvloop too, so a phase timed with
the loop's clock shows up here as whole milliseconds.
"""

from __future__ import annotations

import uvloop
from disagg_helpers import CONFIG, LOCAL_PREFILL_MAX_TOKENS, first_wave

from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.router.router_config import RouterConfig

NUM_REQUESTS = 6


def whole_milliseconds(seconds: float) -> bool:
    return abs(seconds * 1000 - round(seconds * 1000)) < 1e-6


def test_reserve_and_prefill_phases_are_timed_below_a_millisecond_on_uvloop():
    prompts = [p for p in first_wave() if len(p) > LOCAL_PREFILL_MAX_TOKENS][:NUM_REQUESTS]
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)

    async def scenario():
        router_config = RouterConfig(local_prefill_max_tokens=LOCAL_PREFILL_MAX_TOKENS)
        async with await InProcessCluster.start(CONFIG, router_config=router_config) as cluster:
            transfers = []
            for prompt in prompts:  # one at a time: no reserve waits behind another's prefill
                outputs = [out async for out in cluster.generate(prompt, params)]
                transfers.append(outputs[-1].transfer)
            return transfers

    transfers = uvloop.run(scenario())
    assert len(transfers) == NUM_REQUESTS and all(t is not None for t in transfers), transfers
    for name in ("reserve_s", "compute_s"):
        seconds = [getattr(t, name) for t in transfers]
        assert all(s > 0 for s in seconds), (name, seconds)
        # a clock of whole milliseconds gives only multiples of 1 ms; a fine one almost never does
        assert not all(whole_milliseconds(s) for s in seconds), (name, seconds)
