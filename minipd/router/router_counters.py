"""What the router counts (shown on /metrics and read by tests), in one struct that the router
and each try (attempt.py) share, so that a try counts without holding the router."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from minipd.policy.local_prefill import Placement

log = logging.getLogger(__name__)


@dataclass
class RouterCounters:
    placements: Counter[Placement] = field(default_factory=Counter)  # local-prefill policy decisions
    num_busy_waits: int = 0  # reservations retried because a decode pool was full
    num_transfer_failures: int = 0
    num_stale_retries: int = 0  # tries refused for a stale role epoch, and retried
    num_busy_redirects: int = 0  # tries a full decode instance refused, sent to another one
    num_evictions: int = 0  # instances declared dead for silence
    num_readmissions: int = 0  # lost instances that answered again and were registered as new members
    num_recomputes: int = 0  # requests whose KV did not load, prefilled again on their decode instance
    num_migrations: int = 0  # requests gone on elsewhere after their decode instance was lost mid-stream
    on_transfer_failure: Callable[[str], None] | None = None  # told of each failed KV transfer

    def transfer_failed(self, what: str) -> None:
        """A KV transfer failed (seen by the sender or by the receiver)."""
        self.num_transfer_failures += 1
        log.warning("KV transfer failed: %s", what)
        if self.on_transfer_failure is not None:
            self.on_transfer_failure(what)
