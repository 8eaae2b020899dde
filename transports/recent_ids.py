"""A bounded memory of recently seen request ids (aborted ones, mostly), oldest forgotten first."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class RecentIds(Generic[V]):
    """At most `capacity` ids, each with a value; remembering one more forgets the oldest.
    Bounded so that a long-running instance does not grow with every request it ever saw."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._ids: OrderedDict[str, V] = OrderedDict()

    def remember(self, request_id: str, value: V) -> None:
        self._ids[request_id] = value
        self._ids.move_to_end(request_id)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def get(self, request_id: str) -> V | None:
        return self._ids.get(request_id)

    def forget(self, request_id: str) -> None:
        self._ids.pop(request_id, None)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
