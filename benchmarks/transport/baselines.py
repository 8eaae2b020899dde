"""The transport bench's baselines, measured on the same bytes as the transports: a
single-thread memcpy between touched buffers, and a raw socket (blocking sendall into a peer
process that recv_into's a preallocated buffer, one byte acknowledging each request)."""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import time

import numpy as np

MIB = 1 << 20
SOCKET_CHUNK = 4 * MIB
GBIT = 1e9 / 8


class MemcpyTimer:
    """Single-thread memcpy of `num_bytes` between preallocated, touched buffers."""

    def __init__(self, num_bytes: int) -> None:
        self._src = np.ones(num_bytes, dtype=np.uint8)
        self._dst = np.zeros(num_bytes, dtype=np.uint8)
        np.copyto(self._dst, self._src)

    def seconds(self) -> float:
        start = time.perf_counter()
        np.copyto(self._dst, self._src)
        return time.perf_counter() - start


def _socket_receiver(port_pipe, num_bytes: int, repeats: int) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port_pipe.send(server.getsockname()[1])
    conn, _ = server.accept()
    buffer = memoryview(np.ones(num_bytes, dtype=np.uint8))
    for _ in range(repeats + 1):
        received = 0
        while received < num_bytes:
            received += conn.recv_into(buffer[received:], min(SOCKET_CHUNK, num_bytes - received))
        conn.sendall(b"!")
    conn.close()


def raw_socket_gbps(num_bytes: int, repeats: int) -> float:
    """Blocking sendall into a peer that recv_into's a preallocated buffer; one byte acks."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_socket_receiver, args=(child, num_bytes, repeats), daemon=True)
    process.start()
    port = parent.recv()
    sock = socket.create_connection(("127.0.0.1", port))
    payload = np.ones(num_bytes, dtype=np.uint8)
    times = []
    for rep in range(repeats + 1):
        start = time.perf_counter()
        sock.sendall(payload)
        sock.recv(1)
        if rep:  # the first round warms up
            times.append(time.perf_counter() - start)
    sock.close()
    process.join(timeout=10)
    return num_bytes / statistics.median(times) / GBIT
