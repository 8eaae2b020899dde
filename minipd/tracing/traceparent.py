"""The W3C Trace Context `traceparent` header: `VERSION-TRACEID-PARENTID-FLAGS` in lower-case hex.

It arrives from the network (an HTTP client's header, a control-plane message), so it is
validated strictly and anything else is ignored, never raised: a request with a bad header
is served untraced by the client's trace (it starts a trace of its own). The rules
(https://www.w3.org/TR/trace-context/#traceparent-header): two hex digits of version, ff
being invalid; 32 of trace id and 16 of parent id, neither all zeros; two of flags. A future
version may append fields after a dash; version 00 may not.
"""

from __future__ import annotations

import re
from typing import NamedTuple

TRACEPARENT_CHARS = 55  # version 00's length; what minipd sends
MAX_HEADER_CHARS = 512  # a longer header (of a future version) is not even looked at
TRACEPARENT_PATTERN = r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"  # version 00, as carried on the control plane

_HEADER = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.DOTALL)
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16


class TraceParent(NamedTuple):
    trace_id: str  # 32 lower-case hex digits
    span_id: str  # 16: the caller's span, the parent of ours
    flags: int  # bit 0: sampled

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)

    def header(self) -> str:
        """As version 00 writes it (what minipd passes on)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"


def parse_traceparent(value: object) -> TraceParent | None:
    """The traceparent in `value` (a header's text), or None if it is missing or invalid."""
    if not isinstance(value, str) or len(value) > MAX_HEADER_CHARS:
        return None
    match = _HEADER.fullmatch(value.strip(" \t"))
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE_ID or span_id == _ZERO_SPAN_ID:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))
