"""The refusal of a request that cannot be served now but may be later (shutting down, no
instance reachable); the HTTP front answers it with 503 and `Retry-After: retry_after_s`."""

from __future__ import annotations


class BackendUnavailableError(RuntimeError):
    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s
