"""The router's record of its last requests, kept cheaply for the timelines read later.

`RequestLog` subscribes to the request event seam (request_events.py) for the kinds a request
timeline is made of (every kind but `TokensRelayed`) and keeps each request's events as they
come, in a list on the request (`routed.log`); when the request ends the list joins a ring of
the last `capacity` ended requests (oldest out first), and `version` counts every one that
joined. Nothing is computed per request: the timelines are made from the kept events when
someone reads them (timeline_store.py replays them), on the events' own stamps (`at`) and
messages and on what a request or try holds once set (its id, arrival, prompt, a try's
outcome and reason), never on figures that move on (an instance's load, a try's `local`).

The one thing it does besides keeping: a try it keeps asks its prefill instance for its times
(`attempt.prefill_times_wanted`), for the tries a timeline times (request_timeline.MAX_TRIES).
A request that started before the log subscribed is not kept.
"""

from __future__ import annotations

from collections import deque

from minipd.router.request_events import RequestEnded, RequestEvent, RequestStarted, TryStarted
from minipd.router.request_timeline import MAX_TRIES


class RequestLog:
    def __init__(self, capacity: int):
        self.ended: deque[list[RequestEvent]] = deque(maxlen=capacity)  # oldest first
        self.version = 0  # requests that joined `ended` since start

    def on_request_started(self, event: RequestStarted) -> None:
        event.routed.log = [event]

    def on_try_started(self, event: TryStarted) -> None:
        log = event.attempt.routed.log
        if log is not None:
            log.append(event)
            event.attempt.prefill_times_wanted = event.attempt.number <= MAX_TRIES

    def _keep(self, event: RequestEvent) -> None:
        log = event.attempt.routed.log
        if log is not None:
            log.append(event)

    on_routed = on_reserve_sent = on_decode_busy = on_kv_reserved = _keep
    on_prefill_started = on_prefill_finished = on_recompute = on_stream_started = _keep
    on_kv_transferred = on_first_token = on_try_ended = _keep

    def on_request_ended(self, event: RequestEnded) -> None:
        log = event.routed.log
        if log is not None:
            log.append(event)
            event.routed.log = None
            self.ended.append(log)
            self.version += 1
