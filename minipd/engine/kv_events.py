"""What a block manager's prefix cache gained and lost, for whoever publishes it (the instance
tells its routers: disagg/kv_event_publisher.py; the router's index: router/prefix_index.py).

Events have the shape of vLLM's KV events: `stored` (block hashes registered in the prefix
cache, in chain order, with the hash of the block before the first, None at the prompt's
start), `removed` (hashes evicted), `cleared` (everything forgotten: a pool reset). Hashes are
`block_manager.chain_hashes`, the same in every process.

Bounded: at most `max_pending` hashes wait to be taken. Past that, everything pending is
dropped, nothing more is recorded until the next `take`, and that reports `overflowed`: the
reader must then treat its view as unknown and start again from a snapshot of the cache
(AllBlocksCleared, then what is cached now).
`on_pending` is called (on the thread that records) when the first event since the last
`take` is recorded, so a publisher can wake once per batch.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

DEFAULT_MAX_PENDING = 1 << 16


class Stored(NamedTuple):
    hashes: list[int]
    parent: int | None


class Removed(NamedTuple):
    hashes: list[int]


class Cleared(NamedTuple):
    pass


KVEvent = Stored | Removed | Cleared


class KVEventLog:
    """The pending events of one block manager (see the module docstring)."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING, on_pending: Callable[[], None] | None = None):
        self.max_pending = max_pending
        self.on_pending = on_pending
        self._events: list[KVEvent] = []
        self._num_hashes = 0
        self._overflowed = False

    def stored(self, hash_: int, parent: int | None) -> None:
        """One block registered under `hash_`, after the block `parent` (None: the first)."""
        last = self._events[-1] if self._events else None
        if isinstance(last, Stored) and last.hashes[-1] == parent and not self._overflowed:
            last.hashes.append(hash_)
            self._count(1)
        else:
            self._add(Stored([hash_], parent), 1)

    def removed(self, hash_: int) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, Removed) and not self._overflowed:
            last.hashes.append(hash_)
            self._count(1)
        else:
            self._add(Removed([hash_]), 1)

    def cleared(self) -> None:
        """Everything forgotten: what was pending no longer matters."""
        if not self._overflowed:
            self._events.clear()
            self._num_hashes = 0
        self._add(Cleared(), 0)

    def take(self) -> tuple[bool, list[KVEvent]]:
        """(overflowed since the last take, the events pending, oldest first); empties the log."""
        taken = self._overflowed, self._events
        self._events, self._num_hashes, self._overflowed = [], 0, False
        return taken

    def _add(self, event: KVEvent, num_hashes: int) -> None:
        if self._overflowed:  # the reader starts again from a snapshot: nothing before it counts
            return
        first = not self._events
        self._events.append(event)
        self._count(num_hashes)
        if first and self.on_pending is not None:
            self.on_pending()

    def _count(self, num_hashes: int) -> None:
        self._num_hashes += num_hashes
        if self._num_hashes > self.max_pending:
            self._events, self._num_hashes, self._overflowed = [], 0, True
