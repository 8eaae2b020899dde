"""Each try's id on the instances, and the request it belongs to.

A request gets a fresh id for every try (`request_id@tag.n`): an instance that saw an earlier
try, and remembers it as aborted, never mistakes the new one for it. `tag` is random per
router, so the tries of several routers sharing the instances (whose request ids may be the
same, as each numbers its own) never collide on an instance. The router looks the try that
the messages instances send (tokens, landings, renewals) concern up here by that id."""

from __future__ import annotations

import itertools
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minipd.router.routed_request import RoutedRequest
    from minipd.router.try_state import TryState


class TryIds:
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
