"""A cap on one listener's concurrent connections that an unauthenticated flood cannot fill.

Connections start *pending* (accepted, handshake not yet done) and become *established* once
their peer authenticated. At the cap, a new connection takes the slot of the oldest pending
one (which is closed); only when every slot is established is the new connection refused. A
legitimate peer finishes its handshake within a round trip or two, so connections that never
authenticate cannot lock the real peers out, and memory stays bounded by the cap.
Used by the control-plane servers and by the tcp KV listener.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Generic, Hashable, NamedTuple, TypeVar

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 128
# Refusals are logged for the first one and then every this many, so a flood cannot flood the log.
LOG_EVERY_REFUSALS = 100

C = TypeVar("C", bound=Hashable)


class Admission(NamedTuple):
    admitted: bool
    evicted: Hashable | None  # a pending connection the caller must now close


class ConnectionSlots(Generic[C]):
    def __init__(self, limit: int, name: str) -> None:
        if limit < 1:
            raise ValueError(f"max_connections: must be >= 1, got {limit}")
        self.limit = limit
        self.name = name
        self._pending: OrderedDict[C, None] = OrderedDict()
        self._established: set[C] = set()
        self.num_refused = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._pending) + len(self._established)

    def admit(self, connection: C) -> Admission:
        """Take a slot for a new `connection` (pending until `establish`)."""
        evicted = None
        if len(self) >= self.limit:
            if not self._pending:
                self.num_refused += 1
                if self.num_refused % LOG_EVERY_REFUSALS == 1:
                    logger.warning(
                        "%s: refusing a connection: all %d slots are held by authenticated peers "
                        "(%d refused so far; raise --max-connections?)",
                        self.name,
                        self.limit,
                        self.num_refused,
                    )
                return Admission(False, None)
            evicted, _ = self._pending.popitem(last=False)
            self.num_evicted += 1
            if self.num_evicted % LOG_EVERY_REFUSALS == 1:
                logger.warning(
                    "%s: at %d connections; closing the oldest one that has not authenticated (%d so far)",
                    self.name,
                    self.limit,
                    self.num_evicted,
                )
        self._pending[connection] = None
        return Admission(True, evicted)

    def establish(self, connection: C) -> None:
        """`connection`'s peer authenticated: it can no longer be evicted."""
        if self._pending.pop(connection, 0) is None:
            self._established.add(connection)

    def is_established(self, connection: C) -> bool:
        return connection in self._established

    def release(self, connection: C) -> None:
        """`connection` closed: its slot is free."""
        self._pending.pop(connection, None)
        self._established.discard(connection)
