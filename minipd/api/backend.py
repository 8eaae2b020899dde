"""What the HTTP front needs from whatever serves the requests behind it.

The OpenAI-compatible server (`minipd.api.app`) is written against `ServingBackend`
only, so the same front sits on a colocated `Engine` (`engine_backend.EngineBackend`) and on the
router of a disaggregated cluster. A backend promises:

1. `submit` takes a prompt the front validated (`CheckedPrompt`), checks its invariants
   against its own limits (`vocab_size`, `max_model_len`) and returns a stream that yields `RequestOutput`
   increments until one has `finished`; the last one carries the finish reason and the
   final token counts. Leaving `async with stream` early (client disconnect, error)
   aborts the request everywhere it lives, so every KV block returns to its pool.
2. `ready` answers whether requests can be served now (every instance reachable).
3. `num_waiting` and `instance_stats` never block and never touch the network: they
   return what the backend last knew, so the front can call them on every request and
   on every /metrics scrape.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable, Protocol, runtime_checkable

import msgspec

from minipd.control.kv_tier_report import KVTierReport
from minipd.control.role import Role
from minipd.engine.checked_prompt import CheckedPrompt
from minipd.engine.engine import EngineStats
from minipd.engine.request import RequestOutput
from minipd.models.tokenizers.tokenizer import Tokenizer


class InstanceStats(msgspec.Struct, frozen=True):
    """One serving instance as last seen: its name (unique within the backend), its role
    (`prefill`, `decode`, `both`) and its engine's counters; `stale` when those counters did
    not arrive in time lately (the instance is slow or frozen: they are not trusted)."""

    name: str
    role: Role
    stats: EngineStats
    stale: bool = False
    kv_tier: KVTierReport | None = None  # its use of the shared KV tier (None: it has none)


@runtime_checkable
class OutputStream(Protocol):
    """The consumer side of one request (what `Engine.submit` returns).

    Iterate for increments until one has `finished`; `abort()` is idempotent and a no-op
    once finished; `async with` aborts on leaving the block before the request finished.
    """

    request_id: str

    def abort(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...

    async def __aenter__(self) -> "OutputStream": ...

    async def __aexit__(self, *exc) -> None: ...


@runtime_checkable
class ServingBackend(Protocol):
    """Where the HTTP front sends requests. Every method is called on the event loop."""

    model_name: str  # the id clients pass as `model`
    tokenizer: Tokenizer  # the served model's tokenizer (chat template, token counting)
    max_model_len: int  # longest prompt + output, in tokens (0: not known yet)
    vocab_size: int  # the model's token ids are below this (0: not known yet)

    def submit(self, prompt: CheckedPrompt, request_id: str, *, traceparent: str | None = None) -> OutputStream:
        """Enqueue one validated request; returns its output stream at once. `traceparent`:
        the client's W3C trace context header as it came (unchecked), while tracing is on.

        Raises `InvalidRequestError` (its `field` names the bad input) for a request that
        can never be served, and `BackendUnavailableError` (engine/unavailable.py) for one
        that cannot be served now.
        `request_id` is unique among the backend's live requests.
        """

    async def ready(self) -> bool:
        """True when requests can be served now: every instance started and reachable."""

    def num_waiting(self) -> int:
        """Requests accepted but not yet running anywhere (the front's admission control)."""

    def instance_stats(self) -> list[InstanceStats]:
        """The latest known stats of every instance, one entry per instance."""

    def on_transfer_failure(self, callback: Callable[[str], None]) -> None:
        """Call `callback(what)` for every KV transfer that fails behind this backend (a
        colocated engine has none)."""
