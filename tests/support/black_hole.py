"""A TCP server that accepts every connection and never answers: a collector gone silent.

It listens on a free port of 127.0.0.1 in a thread of the test process, accepts, reads and
discards whatever arrives (so a client's request is sent whole and it waits for the answer),
and holds each connection open until `close`. `endpoint` is an OTLP/HTTP URL pointing at it;
`num_connections` counts the connections accepted so far.
"""

from __future__ import annotations

import selectors
import socket
import threading

READ_CHUNK_BYTES = 65536
POLL_S = 0.1  # the serving thread looks at `close` this often


class BlackHole:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.num_connections = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="black-hole", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        held: list[socket.socket] = []
        try:
            while not self._closed.is_set():
                for key, _ in selector.select(POLL_S):
                    if key.fileobj is self._listener:
                        connection, _ = self._listener.accept()
                        connection.setblocking(False)
                        held.append(connection)
                        self.num_connections += 1
                        selector.register(connection, selectors.EVENT_READ)
                    else:
                        try:
                            data = key.fileobj.recv(READ_CHUNK_BYTES)
                        except OSError:
                            data = b""
                        if not data:  # the client gave up: forget it
                            selector.unregister(key.fileobj)
                            key.fileobj.close()
                            held.remove(key.fileobj)
        finally:
            for connection in held:
                connection.close()
            selector.close()
            self._listener.close()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(10 * POLL_S + 5)
