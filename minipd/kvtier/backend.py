"""What a store must do for the tier (`TierBackend`): the few primitive operations, with no
timeouts, verification or counting of their own; `tier.KVTier` adds those, the same for every
store. A backend may raise from any of them: the tier turns that into misses."""

from __future__ import annotations

import abc
import asyncio
from typing import Callable, NamedTuple, Sequence

# What `put` says of each entry (SKIPPED: not tried, for want of room in the backend's memory).
STORED, PRESENT, FAILED, SKIPPED = "stored", "present", "failed", "skipped"
# What `get` says of a key it did not hand to `consume`.
ABSENT = "absent"  # no value under the key (a miss)
ERROR = "error"  # the store failed for this key (a miss)
WRONG_LENGTH = "wrong length"  # a value of another length than asked for: a verification failure

# `consume(index, value)`: hands the whole stored value (header then payload, contiguous) of the
# index-th key to the tier, which verifies it and copies it out. It may be called from any thread;
# once it returns the backend may reuse the value's memory.
Consume = Callable[[int, "memoryview | bytes"], None]


class Entry(NamedTuple):
    """One value to put: `header` then the `payload` buffers, concatenated."""

    key: str
    header: bytes
    payload: list[memoryview]

    @property
    def nbytes(self) -> int:
        return len(self.header) + sum(b.nbytes for b in self.payload)


class TierBackend(abc.ABC):
    """A store's primitive operations. The tier calls them under its own timeout, so each may be
    cancelled at any await; what a backend must keep through that is said on each method."""

    name: str

    async def register(self, buffer: memoryview) -> None:
        """A long-lived region (an instance's KV pool) the tier will store from and fetch into:
        a store that moves bytes from registered memory (Mooncake) registers it once here, so
        that `put` can send straight from it. The region must outlive the backend."""

    @abc.abstractmethod
    async def exists(self, keys: Sequence[str], leading: bool) -> list[bool]:
        """Whether each key has a value. With `leading`, only the run of leading keys that exist
        matters: a backend may stop looking at the first key missing and say False for the rest."""

    @abc.abstractmethod
    async def put(self, entries: Sequence[Entry], done: Callable[[], None]) -> list[str]:
        """Store each entry unless its key has a value already: STORED, PRESENT, FAILED or SKIPPED.
        `done()` must be called, from any thread, when the backend reads the entries' buffers no
        more, even if this raises or is cancelled (it releases the tier's bound on bytes in
        flight; calls after the first do nothing)."""

    @abc.abstractmethod
    async def get(self, keys: Sequence[str], lengths: Sequence[int], consume: Consume) -> list[str | None]:
        """Hand each key's value, expected to be `lengths[i]` bytes long, to `consume` (None for
        those handed over), or say why not: ABSENT, ERROR, WRONG_LENGTH."""

    @abc.abstractmethod
    async def remove(self, keys: Sequence[str]) -> int:
        """Remove the keys' values, whoever stored them; the number removed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Let go of the store's connections and memory; may take long (the tier bounds it)."""


async def consume_in_thread(values: Sequence[bytes | None], consume: Consume) -> list[str | None]:
    """For stores that return values as bytes (Redis, the fake): verify and copy them out in a
    worker thread (a checksum and copy of a long prefix would stall the event loop for tens of
    ms). A value of another length than asked for goes to `consume` too: its verification names
    what is wrong with it."""

    def run() -> list[str | None]:
        statuses: list[str | None] = []
        for index, value in enumerate(values):
            if value is None:
                statuses.append(ABSENT)
            else:
                consume(index, value)
                statuses.append(None)
        return statuses

    return await asyncio.to_thread(run)
