"""Which requests arrived through which connection of a control server (server.py), so that the
server aborts them when the connection drops: what its handlers call as each request starts
(`track`) and ends (`untrack`).

`ConnectionRequests` is the half of `ControlServer` that a request runs; its state is the
server's (`_requests_of`: connection -> the ids of its live requests; `_untracked`, set
whenever one ends, which a draining server waits on), made by `ControlServer.__init__`.
"""

from __future__ import annotations

from minipd.control.channel import Channel


class ConnectionRequests:
    """The live requests of each connection of a `ControlServer` (server.py), which inherits it."""

    def track(self, channel: Channel, request_id: str) -> None:
        """`request_id` arrived through `channel` (and is aborted if it drops before `untrack`)."""
        self._requests_of.setdefault(channel, set()).add(request_id)

    def untrack(self, channel: Channel, request_id: str) -> None:
        """`request_id` ended; a no-op for one not tracked."""
        self._requests_of.get(channel, set()).discard(request_id)
        self._untracked.set()

    @property
    def num_tracked(self) -> int:
        return sum(len(ids) for ids in self._requests_of.values())
