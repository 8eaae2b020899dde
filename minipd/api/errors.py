"""Errors of the OpenAI-compatible API, in OpenAI's error format.

Every failure the HTTP front answers is an `ApiError`: a status code and a body
`{"error": {"message", "type", "param", "code"}}` whose message starts with the offending
field, so a client can tell what to fix. Nothing internal (tracebacks, exception text)
ever goes into a 500's body; it goes to the log instead.
"""

from __future__ import annotations

import re

import msgspec

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
OVERLOADED = "overloaded_error"
SERVER_ERROR = "server_error"

# msgspec ends validation messages with " - at `$.path[0].field`"
_PATH_SUFFIX = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NAMED_FIELD = re.compile(r"(?P<kind>unknown|missing required) field `(?P<field>[^`]+)`")


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorBody


class ApiError(Exception):
    """An error answered to the client as `status` with an OpenAI error body.

    `retry_after_s`, when set, becomes a `Retry-After` header (overload, unavailable);
    `headers` are added to the response as they are (`WWW-Authenticate` on a 401);
    `close_connection` closes the connection after the answer (the rest of the request was
    not read, so the connection cannot carry another one).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = INVALID_REQUEST,
        code: str | None = None,
        retry_after_s: int | None = None,
        headers: dict[str, str] | None = None,
        close_connection: bool = False,
    ):
        super().__init__(message)
        self.close_connection = close_connection
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code
        self.retry_after_s = retry_after_s
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(ErrorBody(self.message, self.type, self.param, self.code))


def bad_request(param: str | None, message: str) -> ApiError:
    """400 whose message reads `param: message`."""
    return ApiError(400, f"{param}: {message}" if param else message, param=param)


def from_decode_error(exc: msgspec.DecodeError) -> ApiError:
    """400 for a body that is not JSON, or JSON of the wrong shape, naming the field."""
    if not isinstance(exc, msgspec.ValidationError):
        return bad_request(None, f"the request body is not valid JSON: {exc}")
    text = str(exc)
    match = _PATH_SUFFIX.search(text)
    path = match.group("path").lstrip(".") if match else ""
    reason = text[: match.start()] if match else text
    named = _NAMED_FIELD.search(reason)
    if named:  # the message names a field inside the object at `path`
        path = f"{path}.{named.group('field')}" if path else named.group("field")
        reason = "unknown field" if named.group("kind") == "unknown" else "required field missing"
    return bad_request(path or None, reason[0].lower() + reason[1:] if reason else "invalid request")
