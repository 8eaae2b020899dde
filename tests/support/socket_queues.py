"""What the kernel says about a process's sockets (Linux /proc): listening addresses, and
whether bytes sent to a port are still queued in the kernel or have been read by the
process. Tests use it to wait for "the server has read everything" as an event."""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import NamedTuple

LISTEN = "0A"
ESTABLISHED = "01"
POLL_S = 0.02


class TcpRow(NamedTuple):
    local: tuple[str, int]
    remote: tuple[str, int]
    state: str
    tx_queue: int
    rx_queue: int
    inode: int


def _address(text: str) -> tuple[str, int]:
    host, port = text.split(":")
    if len(host) == 8:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(host, 16)))
    else:
        ip = socket.inet_ntop(
            socket.AF_INET6, b"".join(struct.pack("<I", int(host[i : i + 8], 16)) for i in range(0, 32, 8))
        )
    return ip, int(port, 16)


def tcp_rows() -> list[TcpRow]:
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                tx, rx = (int(v, 16) for v in fields[4].split(":"))
                rows.append(TcpRow(_address(fields[1]), _address(fields[2]), fields[3], tx, rx, int(fields[9])))
    return rows


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """Every TCP address process `pid` listens on."""
    inodes = socket_inodes(pid)
    return {row.local for row in tcp_rows() if row.state == LISTEN and row.inode in inodes}


def wait_until_read(port: int, num_connections: int, timeout: float) -> None:
    """Wait until `num_connections` connections to local `port` exist and nothing sent on them
    waits in a kernel queue (sent by us, not yet read by the server); AssertionError after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        rows = tcp_rows()
        served = [r for r in rows if r.local[1] == port and r.state == ESTABLISHED]
        clients = [r for r in rows if r.remote[1] == port and r.state == ESTABLISHED]
        if (
            len(served) >= num_connections
            and all(r.rx_queue == 0 for r in served)
            and all(r.tx_queue == 0 for r in clients)
        ):
            return
        assert time.monotonic() < deadline, f"bytes still queued after {timeout} s: {served} {clients}"
        time.sleep(POLL_S)  # polling the kernel's tables: there is no event to wait on


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")
