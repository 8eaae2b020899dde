"""What one try of a request knows, and how it ended: the state `attempt.Attempt` keeps as it
runs the try, what the router's message dispatch reaches by the try's id (`TryIds`), and
what the events of the try carry to their subscribers (request_events.py).

Each try's id on the instances (`TryIds`): a request gets a fresh id for every try
(`request_id@tag.n`): an instance that saw an earlier try, and remembers it as aborted, never
mistakes the new one for it. `tag` is random per router, so the tries of several routers
sharing the instances (whose request ids may be the same, as each numbers its own) never
collide on an instance. The router looks the try that the messages instances send (tokens,
landings, renewals) concern up there by that id."""

from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import TYPE_CHECKING

from minipd.router.outcome import Outcome

if TYPE_CHECKING:
    from minipd.control.messages import CallError, KVFailed, TokenOutput
    from minipd.engine.request import RequestOutput
    from minipd.policy.local_prefill import Placement
    from minipd.router.registry import InstanceHandle
    from minipd.router.routed_request import RoutedRequest
    from minipd.tracing.spans import Span


class TryState:
    """Try `number` (1 for the first) of `routed`."""

    def __init__(self, routed: RoutedRequest, number: int = 1):
        self.routed, self.number = routed, number
        # what it picked
        self.decode: InstanceHandle | None = None
        self.prefill: InstanceHandle | None = None
        self.placement: Placement | None = None
        self.local = False  # prefilled on its decode instance (placed there, or recomputing)
        self.reserve_s = 0.0  # its reserve call on its decode instance, busy waits included
        # while its KV moves: the prefill instance (its lease renewals are passed on); from the
        # Reserve until the KV is in its decode instance's pool or given up (a recompute), its KV's
        # fate: the one way a KV failure reaches the try, resolved by `kv_failed`
        self.prefilling: InstanceHandle | None = None
        self.kv_fate: asyncio.Future[KVFailed] | None = None
        self.outputs: asyncio.Queue[TokenOutput | CallError] | None = None  # set while an instance streams it
        # what its messages carry for the subscribers (request_events.TryStarted)
        self.traceparent: str | None = None  # the instances' parent span
        self.prefill_times_wanted = False  # the prefill instance reports its times (timelines)
        self.span: Span | None = None  # the tracing subscriber's: the try's span, and its recompute's
        self.recompute_span: Span | None = None
        # how it ended (`attempt.Attempt.end`, once)
        self.outcome: Outcome | None = None
        self.reason: str | None = None  # why it failed (a FINISHED try's: its output's error)
        self.blamed: str | None = None  # the instance left out of the next try
        self.retried = False  # whether the request was tried again after it
        self.output: RequestOutput | None = None  # the request's final output, FINISHED

    def kv_failed(self, failure: KVFailed) -> bool:
        """An instance reports that the KV of this try will not land; True if this report decides
        its fate (the first one while the try watches its KV; a later one, or one that comes
        once the try gave its KV up, repeats a failure already acted on)."""
        if self.kv_fate is None or self.kv_fate.done():
            return False
        self.kv_fate.set_result(failure)
        return True


class TryIds:
    """The live tries by their id on the instances (module docstring)."""

    def __init__(self) -> None:
        self._by_wire: dict[str, TryState] = {}
        self._next = itertools.count()
        self._tag = secrets.token_hex(4)  # this router's, among those sharing the instances

    def begin(self, state: TryState) -> None:
        """Give the request of `state` a fresh id for it (`routed.wire_id`); its previous one is forgotten."""
        routed = state.routed
        self._by_wire.pop(routed.wire_id, None)
        routed.wire_id = f"{routed.request_id}@{self._tag}.{next(self._next)}"
        self._by_wire[routed.wire_id] = state

    def get(self, wire_id: str) -> TryState | None:
        return self._by_wire.get(wire_id)

    def forget(self, routed: RoutedRequest) -> None:
        self._by_wire.pop(routed.wire_id, None)
