"""Server-sent events: the framing, and the hub that shares one snapshot per tick among viewers.

Framing (the WHATWG "event stream" format): an event is `event: NAME` and one `data:` line per
line of its payload, ended by a blank line; a line starting with `:` is a comment, which a
client ignores (sent as a keep-alive). The payload here is compact JSON, so one `data:` line.

`SnapshotHub` calls its `build` once per `interval_s` whether anyone watches or not (the
snapshot carries the series history, which must keep growing for a viewer who arrives later),
encodes it once and hands the same bytes to every viewer: the cost of a tick does not grow with
the number of viewers. A viewer waits for the next version; one that falls behind skips to the
newest snapshot rather than queueing old ones.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import msgspec

log = logging.getLogger(__name__)

EVENT_SNAPSHOT = "snapshot"
KEEPALIVE = b": keep-alive\n\n"


def sse_frame(data: bytes | str, event: str | None = None, event_id: str | None = None) -> bytes:
    """One event in the event-stream format; every line of `data` becomes a `data:` line."""
    text = data.decode() if isinstance(data, bytes) else data
    for field, value in (("event", event), ("id", event_id)):
        if value is not None and ("\n" in value or "\r" in value):
            raise ValueError(f"sse {field}: must be one line, got {value!r}")
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.extend(f"data: {line}" for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return ("\n".join(lines) + "\n\n").encode()


def parse_sse(stream: bytes) -> list[tuple[str, str]]:
    """(event, data) of every complete event in `stream` (the inverse of `sse_frame`, for
    clients and tests; comments and ids are skipped, an event without a name is `message`)."""
    events = []
    for block in stream.replace(b"\r\n", b"\n").split(b"\n\n")[:-1]:
        name, data = "message", []
        for line in block.decode().split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        if data:
            events.append((name, "\n".join(data)))
    return events


class SnapshotHub:
    """Builds `build()` every `interval_s` and shares its encoded frame with every viewer."""

    def __init__(self, build: Callable[[], dict], interval_s: float = 1.0, max_viewers: int = 32):
        if not interval_s > 0:
            raise ValueError(f"interval_s: must be positive, got {interval_s}")
        self.build, self.interval_s, self.max_viewers = build, interval_s, max_viewers
        self.version = 0
        self.snapshot: dict | None = None
        self.frame = b""
        self.num_viewers = 0
        self.closed = False
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def tick(self) -> None:
        """Build, encode and publish one snapshot."""
        snapshot = self.build()
        self.snapshot = snapshot
        self.frame = sse_frame(msgspec.json.encode(snapshot), EVENT_SNAPSHOT, str(self.version + 1))
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def _run(self) -> None:
        while not self.closed:
            try:
                await self.tick()
            except Exception:  # one bad snapshot must not end the dashboard (nor the server)
                log.exception("dashboard: building the snapshot failed")
            await asyncio.sleep(self.interval_s)  # the push period, not a synchronisation

    async def next_frame(self, seen: int, timeout: float) -> tuple[int, bytes | None]:
        """The newest frame once its version is past `seen`: (version, frame); (seen, None)
        after `timeout` without one, or once the hub closed (then `closed` is set)."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.version > seen or self.closed), timeout)
            except TimeoutError:
                return seen, None
        if self.closed:
            return seen, None
        return self.version, self.frame

    async def close(self) -> None:
        """Stop ticking and release every viewer (their streams end)."""
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        async with self._changed:
            self._changed.notify_all()
