"""Refuse requests from other sites: a foreign `Host` (DNS rebinding), and a state-changing
request that a page of another origin sent.

`HostGuard(allowed).middleware` runs on every route of an app, before the API key is looked
at (so the key is no way around it) and for unknown routes too:
- a request whose `Host` is not one of `allowed`'s names (allowed_hosts.py) gets 403, naming
  the `--allowed-hosts` flag that would allow it: it can read nothing (/dashboard, /metrics,
  /v1/models, /health) and change nothing. The `Host` checked is the request's authority as
  aiohttp reads it: the `Host` header, or the target's own when a request line names an
  absolute URL (RFC 9112 gives that precedence; then the header is checked as well). A
  request without `Host` is HTTP/1.0 (aiohttp answers 400 to an HTTP/1.1 one): it is checked
  against the address it arrived on, an IP address, so it passes. No browser sends one, so
  it cannot be a rebinding attack, and old probes that send none keep working.
- a request that may change something (any method but GET, HEAD and OPTIONS) whose `Origin`
  is present and is not this server's own (http or https, the same host and port as the
  request's `Host`; a missing port is the scheme's default), or whose `Sec-Fetch-Site` says
  another site sent it (`cross-site`, `same-site`: a page on another port of this host is
  same-site), gets 403 as well, as Go's CrossOriginProtection does. Clients that are no
  browser send neither header. Together with refusing non-JSON bodies (json_only.py) this
  keeps a page of another origin from changing anything, even one served from this host.
`*` in `--allowed-hosts` turns both checks off (`AllowedHosts.any_host`), for a server behind
a proxy that does them.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from aiohttp import web

from minipd.api.allowed_hosts import AllowedHosts, split_host
from minipd.api.errors import ApiError

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # change nothing, so any origin may send them
OTHER_SITE = frozenset({"cross-site", "same-site"})  # the Sec-Fetch-Site values of another origin's page
DEFAULT_PORTS = {"http": 80, "https": 443}
SHOWN_CHARS = 100  # of a refused header value, in the answer and the log
FLAG = "--allowed-hosts"
OFF = f"{FLAG} '*' turns this check off, behind a proxy that does it"


class HostGuard:
    def __init__(self, allowed: AllowedHosts):
        self.allowed = allowed

    def check(self, request: web.Request) -> None:
        """Raise ApiError(403) when `request` names a foreign host, or comes from another
        origin and may change something (module docstring)."""
        if self.allowed.any_host:
            return
        header = request.headers.get("Host")
        for value in (request.host, header):
            if value is not None and not self.allowed.allows(value):
                raise _foreign_host(request, value)
        if request.method in SAFE_METHODS:
            return
        fetch_site = request.headers.get("Sec-Fetch-Site", "").strip().lower()
        if fetch_site in OTHER_SITE:
            raise _other_origin(request, "Sec-Fetch-Site", fetch_site, "says another site's page sent it")
        origin = request.headers.get("Origin")
        if origin is not None and not same_origin(origin, request.host):
            raise _other_origin(request, "Origin", origin, f"is not this server's own ({request.host})")

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        self.check(request)
        return await handler(request)


def same_origin(origin: str, host: str) -> bool:
    """Whether an `Origin` value is the origin of a request whose `Host` is `host`: http or
    https, the same host part, and the same port (a missing one is the scheme's default)."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return False
    theirs, ours = split_host(parts.netloc), split_host(host)
    if theirs is None or ours is None:
        return False
    default = DEFAULT_PORTS[parts.scheme]
    return theirs.host == ours.host and (theirs.port or default) == (ours.port or default)


def _shown(value: str) -> str:
    return repr(value[:SHOWN_CHARS] + ("..." if len(value) > SHOWN_CHARS else ""))


def _foreign_host(request: web.Request, value: str) -> ApiError:
    log.info(
        "refused %s %s from %s: Host %s is not allowed", request.method, request.path, request.remote, _shown(value)
    )
    parsed = split_host(value)
    hint = f"{FLAG} {parsed.host}" if parsed is not None else FLAG
    return ApiError(
        403,
        f"Host: {_shown(value)} is not a name of this server, which answers only to the names it is known by "
        f"(against DNS rebinding); to serve it, start the server with {hint} (comma-separated names; {OFF})",
        param="Host",
        code="host_not_allowed",
    )


def _other_origin(request: web.Request, header: str, value: str, why: str) -> ApiError:
    log.info(
        "refused %s %s from %s: %s %s %s", request.method, request.path, request.remote, header, _shown(value), why
    )
    return ApiError(
        403,
        f"{header}: {_shown(value)} {why}: a request from another origin may not change anything here ({OFF})",
        param=header,
        code="cross_origin_refused",
    )
