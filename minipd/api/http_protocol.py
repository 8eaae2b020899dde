"""Every error the HTTP front answers, in OpenAI's error format: the app's middleware answers
what its routes raise (`errors_middleware`, `error_response`), and aiohttp's connection handler
answers the requests that never reach a route (below).

Some errors never reach a handler or the app's middlewares: aiohttp's request parser refuses a
request (a bad `Content-Length`, both `Content-Length` and `Transfer-Encoding`, a request line
or header field over 8 KiB, a message that is not HTTP), or a client hangs up while its body
is read. aiohttp answers those with its `RequestHandler.handle_error`: a `text/plain` body
carrying the parser's message, which quotes the request's bytes, and an ERROR log with the
traceback, so anyone who can reach the port could fill the log. `JsonErrorHandler` overrides
that one method: the answer is an `ApiError` body naming the problem in a few words (never
the request's bytes), and the log gets one short line at info level (a client's mistake is
no server error) or, for an exception that escaped the app, the traceback as before.

`use_json_errors(runner)` makes a set-up `web.AppRunner` create these handlers. aiohttp has no
option to choose the handler class: its `web.Server` (the protocol factory) is given a
subclass that creates `RequestHandler`s as before and turns them into `JsonErrorHandler`s,
which add no state (`__slots__ = ()`), so the switch changes only methods.
"""

from __future__ import annotations

import asyncio
import logging
import re

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from minipd.api.errors import NOT_FOUND, SERVER_ERROR, ApiError

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()
# aiohttp's parser messages quote the offending bytes after a colon or as a repr (`b'...'`,
# `'...'`); an apostrophe inside a word ("can't") is no quote
_QUOTE_START = re.compile(r"""[:\n"]|(?:^|\s)b?'""")
MAX_REASON_CHARS = 80


def error_response(error: ApiError) -> web.Response:
    headers = dict(error.headers)
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(error.retry_after_s)
    response = web.Response(
        status=error.status, body=_encoder.encode(error.body()), content_type="application/json", headers=headers
    )
    if error.close_connection:
        response.force_close()
    return response


@web.middleware
async def errors_middleware(request: web.Request, handler) -> web.StreamResponse:
    """The app's first middleware: what a route raises becomes its answer in OpenAI's format
    (`ApiError` as it says, aiohttp's own HTTP errors as 404/405/413..., anything else a logged
    bare 500); a cancellation or a lost connection goes on up."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, body too large
        if exc.status < 400:
            raise
        if exc.status in (404, 405):
            message = f"{request.method} {request.path}: {exc.reason}"
        else:
            message = exc.text or exc.reason
        return error_response(
            ApiError(exc.status, message, type=NOT_FOUND if exc.status == 404 else "invalid_request_error")
        )
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal server error; see the server log", type=SERVER_ERROR))


def parser_reason(exc: HttpProcessingError) -> str:
    """The parser's reason without the request bytes it quotes ("Bad Content-Length",
    "Invalid header value char", "Got more than 8190 bytes when reading")."""
    text = exc.message if isinstance(exc.message, str) else ""
    reason = _QUOTE_START.split(text, maxsplit=1)[0].strip().rstrip(".,;")[:MAX_REASON_CHARS]
    return reason or type(exc).__name__


def _answer(error: ApiError) -> web.Response:
    response = web.Response(status=error.status, body=_encoder.encode(error.body()), content_type="application/json")
    response.force_close()  # as aiohttp's own answer: the connection's state is unknown
    return response


class JsonErrorHandler(web.RequestHandler):
    """aiohttp's connection handler, its error answers in OpenAI's format (module docstring)."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: an answer is under way, none can follow
            raise ConnectionError("the response is sent already; cannot answer with an error")
        if isinstance(exc, HttpProcessingError):
            reason = parser_reason(exc)
            log.info("refused a malformed HTTP request from %s: %s", request.remote, reason)
            return _answer(ApiError(400, f"malformed HTTP request: {reason}", code="bad_http_request"))
        if isinstance(exc, ConnectionError):  # the client hung up while its request was read
            log.info("client %s hung up before its request was read", request.remote)
            return _answer(ApiError(400, "the connection was lost while the request was read"))
        if status == 504:  # a handler timed out (aiohttp's own mapping of TimeoutError)
            log.warning("%s %s timed out", request.method, request.path)
            return _answer(ApiError(504, "the request timed out in the server", type=SERVER_ERROR))
        log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
        return _answer(ApiError(500, "internal server error; see the server log", type=SERVER_ERROR))


class _JsonErrorServer(web.Server):
    """The protocol factory: aiohttp's handler, as a `JsonErrorHandler`."""

    def __call__(self) -> web.RequestHandler:
        handler = super().__call__()
        handler.__class__ = JsonErrorHandler
        return handler


def use_json_errors(runner: web.BaseRunner) -> None:
    """Make `runner` (set up, no site started yet) serve with `JsonErrorHandler`s."""
    server = runner.server
    if server is None:
        raise RuntimeError("use_json_errors: the runner is not set up")
    server.__class__ = _JsonErrorServer
