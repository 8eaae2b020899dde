"""An OTLP/HTTP endpoint that takes every export and keeps only counts (the benchmark's collector).

It answers `POST /v1/traces` with 200 at once and never decodes the protobuf (the collector's
cost is not minipd's), counting the posts and their bytes; it runs on a thread of the
benchmark's process, on a free port of 127.0.0.1.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY_BYTES = 64 << 20


class SpanSink:
    def __init__(self) -> None:
        self.num_posts = 0
        self.num_bytes = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", "0"))
                if not 0 <= length <= MAX_BODY_BYTES:
                    self.send_error(413)
                    return
                self.rfile.read(length)
                with sink._lock:
                    sink.num_posts += 1
                    sink.num_bytes += length
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="span-sink", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
