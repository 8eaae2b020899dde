"""The API key of the HTTP front: `Authorization: Bearer KEY`, or 401 in OpenAI's error format.

`ApiKeyGuard.middleware` guards every route of an app except `OPEN_PATHS`, so a route added
later (an admin call such as a role switch) is protected without doing anything; a handler
that must check a key of its own (another key for admin calls, say) calls
`ApiKeyGuard(key).check(request)`. Policy:
- `/health` stays open, as in vLLM: load balancers and orchestrators probe it without
  credentials, and it says only ready or not.
- The dashboard's page (`/dashboard`, its script and style) is open: it holds no data, and asks
  for the key before it fetches any (its data routes need the key like the rest).
- `/metrics` needs the key: it names instances and shows their load. Prometheus sends it
  with `authorization: {credentials: KEY}` in the scrape config.
Keys are compared in constant time.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from minipd.api.errors import INVALID_REQUEST, ApiError

# the dashboard's page and its script and style hold no data: the page asks for the key itself
DASHBOARD_PAGE_PATHS = frozenset(
    {
        "/dashboard",
        "/dashboard/dashboard.js",
        "/dashboard/dashboard.css",
        "/dashboard/timelines.js",
        "/dashboard/kvtier.js",
        "/dashboard/timelines.css",
        "/dashboard/plan.js",
    }
)
OPEN_PATHS = frozenset({"/health"}) | DASHBOARD_PAGE_PATHS
BEARER = "bearer "


class ApiKeyGuard:
    def __init__(self, key: str, open_paths: frozenset[str] = OPEN_PATHS):
        if not key:
            raise ValueError("api_key: must not be empty")
        self._key = key.encode()
        self.open_paths = open_paths

    def check(self, request: web.Request) -> None:
        """Raise ApiError(401) unless `request` carries the key as a bearer token."""
        header = request.headers.get("Authorization", "")
        if not header:
            raise _unauthorized(
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                None,
            )
        if not header[: len(BEARER)].lower() == BEARER:
            raise _unauthorized("Authorization: expected `Bearer YOUR_API_KEY`.", "invalid_api_key")
        presented = header[len(BEARER) :].strip().encode(errors="surrogatepass")
        if not hmac.compare_digest(presented, self._key):
            raise _unauthorized("Incorrect API key provided.", "invalid_api_key")

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path not in self.open_paths:
            self.check(request)
        return await handler(request)


def _unauthorized(message: str, code: str | None) -> ApiError:
    return ApiError(401, message, type=INVALID_REQUEST, code=code, headers={"WWW-Authenticate": "Bearer"})
