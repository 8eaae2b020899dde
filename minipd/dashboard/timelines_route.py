"""`GET /dashboard/requests`: the router's last request timelines, for the page's waterfall.

The answer is JSON: `version` (timelines kept since start: it changes when one is added),
`capacity` (how many are kept), `timelines` (newest first; router/request_timeline.py says what
one holds). It needs the API key like the dashboard's other data routes (the app's
middleware). A colocated front keeps none: it answers `capacity` 0 and no timelines.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from minipd.router.timeline_store import TimelineStore

PATH = "/dashboard/requests"
NONE_KEPT = msgspec.json.encode({"version": 0, "capacity": 0, "timelines": []})


def timelines_extension(store: TimelineStore | None):
    """The app extension serving `store` (None: a front that keeps no timelines)."""

    async def requests(request: web.Request) -> web.Response:
        body = NONE_KEPT if store is None else store.encoded()
        return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-store"})

    def install(app: web.Application) -> None:
        app.router.add_get(PATH, requests)

    return install
