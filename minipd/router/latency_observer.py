"""What the router tells a latency observer (the live ratio controller) as it relays tokens.

The router calls `relay_tokens` for every output that carries tokens, just before the caller
gets it: the request's first token becomes `first_token` (TTFT from the router's arrival, and
the part of it spent waiting on decode: for KV room, or all of it for a prompt prefilled on
its decode instance, which queues there behind the decodes), every later one `tokens` (its gap
to the previous one, and the request's time per output token so far).
"""

from __future__ import annotations

import time
from typing import Protocol

from minipd.router.routed_request import RoutedRequest


class LatencyObserver(Protocol):
    def first_token(self, request_id: str, now: float, ttft_s: float, decode_wait_s: float) -> None: ...

    def tokens(self, now: float, gap_s: float, count: int, tpot_s: float) -> None:
        """`count` tokens after the first, `gap_s` after the request's previous ones; `tpot_s`:
        the request's time per output token so far (since its first token)."""


def relay_tokens(observer: LatencyObserver | None, routed: RoutedRequest, count: int) -> None:
    """`count` tokens of `routed` are about to reach its caller (time.monotonic() stamps)."""
    now = time.monotonic()
    if routed.last_token_s is None:
        routed.first_token_s = now
        if observer is not None:
            observer.first_token(routed.request_id, now, now - routed.arrival_s, routed.decode_wait_so_far(now))
    else:
        routed.num_later_tokens += count
        if observer is not None:
            observer.tokens(
                now, now - routed.last_token_s, count, (now - routed.first_token_s) / routed.num_later_tokens
            )
    routed.last_token_s = now
