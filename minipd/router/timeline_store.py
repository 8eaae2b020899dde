"""The router's last request timelines (request_timeline.py), for the dashboard.

Two ways in: the router's requests come through the store's `log` (request_log.py: the router
subscribes it to its event seam, and it keeps each request's events, nothing more), and are
made into timelines here when the store is read (`timeline_of` replays a request's events, on
their own stamps); a front without a router (a colocated engine's) starts a timeline here
(`start`) and stamps it itself, and the timeline adds itself when the request ends.

The store keeps the last `capacity` timelines (oldest out first) and counts every one added
(`version`, the log's requests included as soon as they ended), so a reader can tell whether
anything changed. Turning them into dicts is done when they are read, not when a request ends,
and once per timeline (an ended timeline does not change: its JSON is kept with it), and the
document once per version: a request pays for keeping its events only, however many viewers
read the store and however often.
"""

from __future__ import annotations

from collections import deque

import msgspec

from minipd.router.request_events import (
    DecodeBusy,
    FirstToken,
    KVReserved,
    KVTransferred,
    PrefillFinished,
    PrefillStarted,
    Recompute,
    RequestEnded,
    RequestEvent,
    ReserveSent,
    Routed,
    StreamStarted,
    TryEnded,
    TryStarted,
)
from minipd.router.request_log import RequestLog
from minipd.router.request_timeline import RequestTimeline

DEFAULT_CAPACITY = 50
MAX_ENCODED_LIMITS = 4  # documents kept per version (the page asks for one limit at a time)


class TimelineStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"capacity: must be at least 1, got {capacity}")
        self.capacity = capacity
        self.log = RequestLog(capacity)  # the router's requests, made into timelines when read
        self._timelines: deque[tuple[RequestTimeline, list[bytes]]] = deque(maxlen=capacity)  # and its JSON, once made
        self._version = 0  # timelines added since start, the log's taken in
        self._log_version = 0  # the log's requests taken in
        self._encoded: dict[int, bytes] = {}  # limit -> the document, for this version
        self._encoded_version = 0

    @property
    def version(self) -> int:
        """Timelines added since start (the log's requests that ended included)."""
        self._take_log()
        return self._version

    def __len__(self) -> int:
        self._take_log()
        return len(self._timelines)

    def start(self, request_id: str, arrival: float, prompt_tokens: int) -> RequestTimeline:
        """A new request's timeline, added here when it ends (`RequestTimeline.end`)."""
        return RequestTimeline(request_id, arrival, prompt_tokens, self.add)

    def add(self, timeline: RequestTimeline) -> None:
        self._take_log()
        self._timelines.append((timeline, []))
        self._version += 1

    def as_dicts(self, limit: int | None = None) -> list[dict]:
        """The kept timelines, newest first (the `limit` newest)."""
        self._take_log()
        return [t.as_dict() for t, _ in list(reversed(self._timelines))[:limit]]

    def document(self, limit: int | None = None) -> dict:
        return {"version": self.version, "capacity": self.capacity, "timelines": self.as_dicts(limit)}

    def encoded(self, limit: int | None = None) -> bytes:
        """`document(limit)` as JSON, encoded once per version and limit (each timeline once)."""
        limit = self.capacity if limit is None else limit
        if self._encoded_version != self.version:
            self._encoded, self._encoded_version = {}, self.version
        if limit not in self._encoded:
            if len(self._encoded) >= MAX_ENCODED_LIMITS:  # a few limits per version, not one per value asked
                self._encoded.pop(next(iter(self._encoded)))
            parts = []
            for timeline, encoded in list(reversed(self._timelines))[:limit]:
                if not encoded:
                    encoded.append(msgspec.json.encode(timeline.as_dict()))
                parts.append(encoded[0])
            head = b'{"version":%d,"capacity":%d,"timelines":[' % (self.version, self.capacity)
            self._encoded[limit] = head + b",".join(parts) + b"]}"
        return self._encoded[limit]

    def _take_log(self) -> None:
        """Make the log's requests that ended since the last read into timelines (those the ring
        dropped meanwhile are counted, as the store would have dropped them)."""
        new = self.log.version - self._log_version
        if new <= 0:
            return
        self._log_version = self.log.version
        kept = list(self.log.ended)[-new:]
        self._version += new - len(kept)
        for events in kept:
            self._timelines.append((timeline_of(events), []))
            self._version += 1


def timeline_of(events: list[RequestEvent]) -> RequestTimeline:
    """The timeline of one request from the events its log kept (the first its RequestStarted),
    as a subscriber stamping it live would have made it."""
    routed = events[0].routed
    timeline = RequestTimeline(routed.request_id, routed.arrival_s, len(routed.prompt_ids))
    for event in events[1:]:
        match event:
            case TryStarted():
                timeline.begin_try(event.at)
                continue
            case KVTransferred():
                landed = event.landed
                timeline.kv_landed(landed.landed_after_s, landed.ordered_after_s, landed.adopt_s)
                continue
            case FirstToken():
                if timeline.first_token is None:
                    timeline.first_token = event.at
                continue
            case TryEnded():
                if event.attempt.outcome.failed_try:
                    timeline.try_failed(event.attempt.reason or "", event.at)
                continue
            case RequestEnded():
                timeline.end(event.output, event.at)
                continue
        times = timeline.current  # the current try's stamps (None past its tries' bound)
        if times is None:
            continue
        match event:
            case Routed():
                times.local = event.prefill is None or event.placement.is_local
                times.decode = event.decode.instance_id
                times.prefill = None if times.local else event.prefill.instance_id
            case ReserveSent():
                times.reserve_sent = event.at
            case DecodeBusy():
                times.busy_waits += 1
            case KVReserved():
                times.reserve_call_sent, times.reserve_received = event.sent, event.at
            case PrefillStarted():
                times.prefill_sent = event.at
            case PrefillFinished():
                times.prefill_received, times.prefill_times = event.at, event.prefilled.times
            case Recompute():
                times.recompute = (event.at, event.reason)
            case StreamStarted():
                times.stream_sent = event.at
    return timeline
