"""The request event seam's dispatch: who subscribes, and which of their methods each kind of
event reaches (the events themselves, and the seam's contract, are request_events.py's).

A subscriber is any object with a method `on_<event>` for each kind it handles (the kind's
`handler`). `publish(kind, *fields)` builds the event only when some subscriber handles its
kind, and hands it to each of them in the order they subscribed; a kind's handlers are looked
up on its first publish after a (un)subscription, so a request with no subscriber costs one
dictionary look-up per step.
"""

from __future__ import annotations

from typing import Any


class RequestEvents:
    """The seam: subscribers, and for each kind of event published since they last changed, the
    methods that handle it."""

    __slots__ = ("_subscribers", "_handlers")

    def __init__(self) -> None:
        self._subscribers: list[Any] = []
        self._handlers: dict[type, tuple] = {}

    def subscribe(self, subscriber: Any) -> None:
        self._subscribers.append(subscriber)
        self._handlers = {}

    def unsubscribe(self, subscriber: Any) -> None:
        """Stop telling `subscriber` (a no-op for one not subscribed)."""
        if subscriber in self._subscribers:
            self._subscribers.remove(subscriber)
            self._handlers = {}

    @property
    def subscribers(self) -> tuple:
        return tuple(self._subscribers)

    def publish(self, kind: type, *fields: Any) -> None:
        """Build a `kind` from `fields` and hand it to its handlers, if it has any."""
        handlers = self._handlers.get(kind)
        if handlers is None:
            name = kind.handler
            handlers = self._handlers[kind] = tuple(
                getattr(s, name) for s in self._subscribers if callable(getattr(s, name, None))
            )
        if handlers:
            event = kind(*fields)
            for handle in handlers:
                handle(event)
