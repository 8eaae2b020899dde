"""`GET /dashboard/requests[?limit=N]`: the router's last request timelines, for the page's waterfall.

`limit` (1 to the store's capacity; default all kept) asks for the N newest only; anything
else is a 400 naming `limit`. The answer is JSON: `version` (timelines kept since start: it changes when one is added),
`capacity` (how many are kept), `timelines` (newest first; router/request_timeline.py says what
one holds). It needs the API key like the dashboard's other data routes (the app's
middleware). The store is the router's, or on a colocated front the observed backend's.
"""

from __future__ import annotations

from aiohttp import web

from minipd.api.errors import ApiError
from minipd.router.timeline_store import TimelineStore

PATH = "/dashboard/requests"


def timelines_extension(store: TimelineStore):
    """The app extension serving `store`."""

    async def requests(request: web.Request) -> web.Response:
        body = store.encoded(_limit(request, store.capacity))
        return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-store"})

    def install(app: web.Application) -> None:
        app.router.add_get(PATH, requests)

    return install


def _limit(request: web.Request, capacity: int) -> int:
    text = request.query.get("limit")
    if text is None:
        return capacity
    if not (text.isdigit() and len(text) <= 6 and 1 <= int(text) <= capacity):
        raise ApiError(400, f"limit: must be a whole number from 1 to {capacity}, got {text[:20]!r}", param="limit")
    return int(text)
