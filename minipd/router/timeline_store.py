"""The router's last request timelines (request_timeline.py), for the dashboard.

The router starts a request's timeline here (`start`), and the timeline adds itself when the
request ends (finished, failed or aborted);
the store keeps the last `capacity` (oldest out first) and counts every one added
(`version`), so a reader can tell whether anything changed. Turning them into dicts is done
when they are read, not when a request ends, and once per timeline (an ended timeline does not
change: its JSON is kept with it), and the document once per version: a request pays for its
stamps only, however many viewers read the store and however often.
"""

from __future__ import annotations

from collections import deque

import msgspec

from minipd.router.request_timeline import RequestTimeline

DEFAULT_CAPACITY = 50
MAX_ENCODED_LIMITS = 4  # documents kept per version (the page asks for one limit at a time)


class TimelineStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"capacity: must be at least 1, got {capacity}")
        self.capacity = capacity
        self._timelines: deque[tuple[RequestTimeline, list[bytes]]] = deque(maxlen=capacity)  # and its JSON, once made
        self.version = 0  # timelines added since start
        self._encoded: dict[int, bytes] = {}  # limit -> the document, for this version
        self._encoded_version = 0

    def __len__(self) -> int:
        return len(self._timelines)

    def start(self, request_id: str, arrival: float, prompt_tokens: int) -> RequestTimeline:
        """A new request's timeline, added here when it ends (`RequestTimeline.end`)."""
        return RequestTimeline(request_id, arrival, prompt_tokens, self.add)

    def add(self, timeline: RequestTimeline) -> None:
        self._timelines.append((timeline, []))
        self.version += 1

    def as_dicts(self, limit: int | None = None) -> list[dict]:
        """The kept timelines, newest first (the `limit` newest)."""
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
