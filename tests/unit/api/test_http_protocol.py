"""The reason given for a request aiohttp's parser refuses names the problem, never the request's
bytes, which aiohttp's messages quote (a raw-socket test of the answers: tests/inprocess/test_http_corners.py)."""

from __future__ import annotations

import pytest
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, InvalidHeader, LineTooLong

from minipd.api.http_protocol import MAX_REASON_CHARS, parser_reason

REQUEST_BYTES = "zq7MARKERzq7"


@pytest.mark.parametrize(
    "exc, reason",
    [
        (BadHttpMessage("Transfer-Encoding can't be present with Content-Length"), None),  # kept whole
        (BadHttpMessage(f"Invalid header value char:\n\n  b'{REQUEST_BYTES}'\n   ^"), "Invalid header value char"),
        (BadStatusLine(f"GET {REQUEST_BYTES}"), "Bad status line"),
        (InvalidHeader(REQUEST_BYTES.encode()), "Invalid HTTP header"),
        (LineTooLong(REQUEST_BYTES, "8190"), "Got more than 8190 bytes when reading"),
        (BadHttpMessage(f"'{REQUEST_BYTES}'"), "BadHttpMessage"),  # nothing but the quote: the kind
    ],
)
def test_the_reason_leaves_out_the_request_bytes(exc, reason):
    got = parser_reason(exc)
    assert got == (reason or exc.message) and REQUEST_BYTES not in got and len(got) <= MAX_REASON_CHARS
