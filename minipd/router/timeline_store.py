"""The router's last request timelines (request_timeline.py), for the dashboard.

The router starts a request's timeline here (`start`), and the timeline adds itself when the
request ends (finished, failed or aborted);
the store keeps the last `capacity` (oldest out first) and counts every one added
(`version`), so a reader can tell whether anything changed. Turning them into dicts is done
when they are read, not when a request ends, and once per version: a request pays for its
stamps only, however many viewers read the store.
"""

from __future__ import annotations

from collections import deque

import msgspec

from minipd.router.request_timeline import RequestTimeline

DEFAULT_CAPACITY = 50


class TimelineStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"capacity: must be at least 1, got {capacity}")
        self.capacity = capacity
        self._timelines: deque[RequestTimeline] = deque(maxlen=capacity)
        self.version = 0  # timelines added since start
        self._encoded: tuple[int, bytes] | None = None

    def __len__(self) -> int:
        return len(self._timelines)

    def start(self, request_id: str, arrival: float, prompt_tokens: int) -> RequestTimeline:
        """A new request's timeline, added here when it ends (`RequestTimeline.end`)."""
        return RequestTimeline(request_id, arrival, prompt_tokens, self.add)

    def add(self, timeline: RequestTimeline) -> None:
        self._timelines.append(timeline)
        self.version += 1

    def as_dicts(self) -> list[dict]:
        """The kept timelines, newest first."""
        return [t.as_dict() for t in reversed(self._timelines)]

    def document(self) -> dict:
        return {"version": self.version, "capacity": self.capacity, "timelines": self.as_dicts()}

    def encoded(self) -> bytes:
        """`document()` as JSON, encoded once per version."""
        if self._encoded is None or self._encoded[0] != self.version:
            self._encoded = (self.version, msgspec.json.encode(self.document()))
        return self._encoded[1]
