"""Conditional disaggregation in the live router: the planner's policy fed with the router's view.

`minipd.policy.local_prefill.place_prefill` decides (the same pure function the
simulator runs); this module builds its input from what the router knows at pick time,
without asking any instance:
- the prompt's uncached part on the decode instance (`InstanceRegistry.overlap`: what its KV
  events say it holds, what the router sent it, or, with the shared KV tier, the tier's run:
  a prompt the tier holds whole runs on the decode instance, which fetches it and skips
  prefill);
- the prefill pool's load: the least-loaded prefill instance's queued prompt tokens and
  prompts, counted by the router from pick to first token (real time, not polled);
- the decode instance's room: its free KV from its last stats (polled every
  `STATS_INTERVAL_S`), and the sequences it runs: the larger of its last stats and the
  requests the router has routed there (real time).
Thresholds come from `RouterConfig` (flags `--local-prefill-max-tokens`,
`--prefill-busy-tokens`, `--prefill-busy-requests`, `--decode-room-kv-fraction`,
`--decode-room-max-running`).
"""

from __future__ import annotations

from minipd.policy.local_prefill import LocalPrefillThresholds, Placement, PlacementInput, place_prefill
from minipd.router.registry import InstanceHandle


def placement_input(
    decode: InstanceHandle,
    prefill_pool: list[InstanceHandle],
    prompt_len: int,
    uncached_on_decode: int,
    max_tokens: int,
    block_size: int,
) -> PlacementInput:
    """The policy's view of one request about to run on `decode`, with `prefill_pool` the
    prefill instances it could be sent to instead."""
    stats = decode.stats
    num_blocks = stats.num_blocks if stats else 0
    free_blocks = stats.num_free_blocks if stats else 0
    reported_running = stats.num_running + stats.num_waiting if stats else 0
    return PlacementInput(
        # the last prompt token always runs on the instance that samples the first token
        uncached_tokens=max(1, uncached_on_decode),
        prefill_queue_tokens=min((h.num_inflight_tokens for h in prefill_pool), default=0),
        prefill_queue_requests=min((h.num_inflight for h in prefill_pool), default=0),
        num_prefill_instances=len(prefill_pool),
        decode_kv_free_tokens=free_blocks * block_size,
        decode_kv_capacity_tokens=num_blocks * block_size,
        request_kv_tokens=prompt_len + max_tokens,
        decode_running=max(reported_running, decode.num_inflight),
        decode_max_num_seqs=decode.welcome.max_num_seqs,
    )  # 0 (unknown) vetoes the prefill-busy rule


def decide_placement(
    decode: InstanceHandle,
    prefill_pool: list[InstanceHandle],
    prompt_len: int,
    uncached_on_decode: int,
    max_tokens: int,
    block_size: int,
    thresholds: LocalPrefillThresholds,
) -> Placement:
    return place_prefill(
        placement_input(decode, prefill_pool, prompt_len, uncached_on_decode, max_tokens, block_size), thresholds
    )
