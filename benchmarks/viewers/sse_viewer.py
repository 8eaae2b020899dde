"""A dashboard viewer without a browser: a thread that reads `GET /dashboard/events` (server-sent
events, with the API key as a Bearer header, as the page sends it) and counts the snapshot
events and bytes it receives, until closed."""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.parse

READ_TIMEOUT_S = 30.0
EVENT_LINE = b"event: snapshot"


class SseViewer:
    def __init__(self, base_url: str, api_key: str | None):
        parsed = urllib.parse.urlsplit(base_url)
        self._conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=READ_TIMEOUT_S)
        headers = {"Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._conn.request("GET", "/dashboard/events", headers=headers)
        response = self._conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"/dashboard/events answered {response.status}: {response.read(500)!r}")
        self._response = response
        self.num_snapshots = 0
        self.num_bytes = 0
        self.error: str | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._read, name="sse-viewer", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._response:
                self.num_bytes += len(line)
                if line.rstrip(b"\r\n") == EVENT_LINE:
                    self.num_snapshots += 1
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if not self._closing:
                self.error = str(exc)

    def close(self) -> None:
        self._closing = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # ends the reader's blocking read
            except OSError:
                pass
        self._thread.join(READ_TIMEOUT_S)  # the reader sees the end of the stream, then the socket goes
        self._conn.close()
