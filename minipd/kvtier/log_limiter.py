"""Warnings that cannot flood the log: a store that is down fails every call of every request."""

from __future__ import annotations

import logging
import time


class LogLimiter:
    """Logs each kind of event at most once per `interval_s`, with how many went unlogged since."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._logger, self._interval_s = logger, interval_s
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def warning(self, kind: str, message: str) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval_s:
            self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
            return
        self._last[kind] = now
        unlogged = self._unlogged.pop(kind, 0)
        suffix = f" ({unlogged} more like it unlogged in the last {self._interval_s:g} s)" if unlogged else ""
        self._logger.warning("%s%s", message, suffix)
