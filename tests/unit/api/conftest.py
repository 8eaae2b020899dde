"""The API tests' server factory: `serve(backend, **HttpConfig fields)` starts an app on the shared
loop thread and closes it after the test."""

from __future__ import annotations

import pytest
from aiohttp import web

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.backend import ServingBackend

MAX_BODY_BYTES = 16 * 1024


class Served:
    """An app started on the loop thread; `url` is its base URL."""

    def __init__(self, loop_thread, app: web.Application):
        self.loop_thread, self.app = loop_thread, app
        self.runner, port = loop_thread.run(start_http_server(app, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.loop_thread.run(self.runner.cleanup())


@pytest.fixture
def serve(loop_thread):
    """Factory: serve a backend with a config; every server is closed after the test."""
    served: list[Served] = []

    def factory(backend: ServingBackend, **config) -> Served:
        config.setdefault("max_request_body_bytes", MAX_BODY_BYTES)
        served.append(Served(loop_thread, build_app(backend, HttpConfig(**config))))
        return served[-1]

    yield factory
    for s in served:
        s.close()
