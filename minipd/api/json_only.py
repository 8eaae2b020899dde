"""POST bodies must say they are JSON.

A web page may send a "simple" cross-origin request (text/plain, form encodings) to any
local port without a CORS preflight; by refusing every POST that is not
`application/json` with 415, no page in a browser on this host can drive the API.
"""

from __future__ import annotations

from aiohttp import web

from minipd.api.errors import ApiError

JSON_CONTENT_TYPE = "application/json"


def require_json(http_request: web.Request) -> None:
    """Raise ApiError 415 unless the request's Content-Type is application/json."""
    if http_request.content_type != JSON_CONTENT_TYPE:  # aiohttp: lower-cased, without parameters
        given = http_request.headers.get("Content-Type")
        raise ApiError(
            415,
            f"Content-Type: expected {JSON_CONTENT_TYPE}, got {repr(given) if given else 'none'}",
            param="Content-Type",
            code="unsupported_media_type",
        )
