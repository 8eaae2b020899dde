"""One fetch from the shared KV tier as a span: `minipd.kv_tier.fetch`, a child of the request's
span on the instance (`minipd.prefill` or `minipd.generate`), from the lookup to the fetched
blocks registered (disagg/tier_wire.py).

Its attributes:
- `minipd.kv_tier.local_blocks`: the prompt's leading blocks found in the local prefix cache;
- `minipd.kv_tier.blocks_asked`: the full blocks past them asked of the tier;
- `minipd.kv_tier.blocks_found`: how many leading ones the tier said it has;
- `minipd.kv_tier.blocks_fetched`: how many leading ones were fetched and verified (used);
- `minipd.kv_tier.bytes`: the payload bytes of the blocks fetched (used) into the pool;
- `minipd.kv_tier.hit`: whether any block came from the tier;
- `minipd.kv_tier.outcome`: `hit` (every block found was fetched), `partial` (fewer: the rest
  computed, a fetch fallback), `miss` (the tier has none), `no_room` (the pool had no spare
  blocks: computed), `declined` (computing the blocks was predicted faster than asking for or
  fetching them, kvtier/fetch_cost.py: computed), `timeout` or `error` (a call of this fetch
  ran past its bound or failed in the store: computed). `timeout` and `error` are read from
  the tier's counters around the fetch, so a call of another request failing at the same
  moment may be counted in this one.
"""

from __future__ import annotations

import dataclasses

from minipd.kvtier.stats import KVTierStats
from minipd.tracing import names
from minipd.tracing.spans import Span

HIT, PARTIAL, MISS, NO_ROOM, TIMEOUT, ERROR = "hit", "partial", "miss", "no_room", "timeout", "error"
DECLINED = "declined"


@dataclasses.dataclass
class TierFetch:
    """What one fetch did; `settle` once it is over."""

    local_blocks: int
    blocks_asked: int
    before: KVTierStats
    found: int = 0
    fetched: int = 0
    no_room: bool = False
    declined: bool = False  # computing was predicted faster (fetch_cost.py)
    fallback: bool = False
    bytes: int = 0  # the fetched blocks' payload, set by the fetcher
    timed_out: bool = False
    failed: bool = False

    def settle(self, after: KVTierStats) -> None:
        self.timed_out = after.timeouts > self.before.timeouts
        self.failed = after.errors > self.before.errors

    @property
    def outcome(self) -> str:
        if self.fetched and not self.fallback:
            return HIT
        if self.declined:
            return DECLINED
        if self.timed_out:
            return TIMEOUT
        if self.failed:
            return ERROR
        if self.fetched or self.fallback:
            return PARTIAL
        return NO_ROOM if self.no_room else MISS


def fetch_span(parent: Span | None, fetch: TierFetch) -> Span | None:
    """The fetch's span under `parent` (None: the request is not traced, nor is its fetch)."""
    if parent is None:
        return None
    return parent.child(
        names.KV_TIER_FETCH,
        {"minipd.kv_tier.local_blocks": fetch.local_blocks, "minipd.kv_tier.blocks_asked": fetch.blocks_asked},
    )


def end_fetch_span(span: Span, fetch: TierFetch) -> None:
    outcome = fetch.outcome
    span.set(
        {
            "minipd.kv_tier.blocks_found": fetch.found,
            "minipd.kv_tier.blocks_fetched": fetch.fetched,
            "minipd.kv_tier.bytes": fetch.bytes,
            "minipd.kv_tier.hit": fetch.fetched > 0,
            "minipd.kv_tier.outcome": outcome,
        }
    )
    span.end(outcome if outcome in (TIMEOUT, ERROR) else None)
