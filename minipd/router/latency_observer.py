"""What the router tells a latency observer (the live ratio controller) as it relays tokens.

Set as `Router.latency_observer`, it hears of every output that carries tokens, just before the
caller gets it (through the router's event seam: request_subscribers.LatencyRelay): the
request's first token becomes `first_token` (TTFT from the router's arrival, and
the part of it spent waiting on decode: for KV room, or all of it for a prompt prefilled on
its decode instance, which queues there behind the decodes), every later one `tokens` (its gap
to the previous one, and the request's time per output token so far).
"""

from __future__ import annotations

from typing import Protocol


class LatencyObserver(Protocol):
    def first_token(self, request_id: str, now: float, ttft_s: float, decode_wait_s: float) -> None: ...

    def tokens(self, now: float, gap_s: float, count: int, tpot_s: float) -> None:
        """`count` tokens after the first, `gap_s` after the request's previous ones; `tpot_s`:
        the request's time per output token so far (since its first token)."""
