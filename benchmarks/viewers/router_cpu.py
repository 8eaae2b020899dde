"""Part one of `bench.py viewers`: the router's CPU with 0 and with `num_viewers` dashboard viewers.

A real `minipd --role router` (its own process, an HTTP port, `--api-key` and
`--cluster-secret`) gets `num_instances` fake instances registered (fake_instances.py: the real
handshake and Register, GetStats answered); then windows of `window_s` alternate between no
viewer and `num_viewers` open `GET /dashboard/events` streams (sse_viewer.py), `repeats` of each,
the order flipping every round. The router's CPU seconds over a window are utime + stime of its
process (all its threads) from /proc/PID/stat; the figure is the median over the windows, as a
percentage of one core.
"""

from __future__ import annotations

import os
import re
import secrets
import statistics
import time
from typing import NamedTuple

from benchmarks.loadgen.deployments import READY_TIMEOUT_S, minipd_command, parse_announcement, wait_healthy
from benchmarks.loadgen.processes import Processes
from benchmarks.viewers.fake_instances import LOCALHOST, FakeFleet
from benchmarks.viewers.sse_viewer import SseViewer
from transports.shared_secret import SharedSecret

CONTROL_READY = re.compile(r"^READY router \S+ (\S+):(\d+)$")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_S = 1.5  # after a change of viewers, before a window: a stream's first snapshot is out


class CpuOptions(NamedTuple):
    num_instances: int
    num_viewers: int
    window_s: float
    repeats: int


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (every thread), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5)


def _announcements():
    """A line parser for `wait_for_line` that returns (HTTP URL, control address) once it has
    seen both lines (they may arrive in one read, and the reader stops at the first match)."""
    seen: dict[str, object] = {}

    def parse(line: str):
        url = parse_announcement(line)
        if url is not None:
            seen["url"] = url
        match = CONTROL_READY.match(line)
        if match:
            seen["control"] = (match.group(1), int(match.group(2)))
        return (seen["url"], seen["control"]) if len(seen) == 2 else None

    return parse


def _window(pid: int, window_s: float) -> float:
    """The router's CPU over the next `window_s`, as % of one core."""
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    time.sleep(window_s)  # the measurement window itself
    return 100.0 * (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start)


def measure_router_cpu(options: CpuOptions) -> dict:
    api_key, secret_text = secrets.token_hex(16), secrets.token_hex(32)
    argv = [*minipd_command(), "--role", "router", "--port", "0", "--http-port", "0"]
    argv += ["--api-key", api_key, "--cluster-secret", secret_text, "--host", LOCALHOST]
    with Processes() as processes:
        router = processes.start("router", argv)
        url, control = router.wait_for_line(_announcements(), READY_TIMEOUT_S)
        router.drain()
        fleet = FakeFleet(control, options.num_instances, SharedSecret.from_text(secret_text))
        try:
            wait_healthy(url, router)
            pid = router.process.pid
            samples: dict[int, list[float]] = {0: [], options.num_viewers: []}
            snapshots: list[int] = []
            snapshot_bytes: list[int] = []
            for round_number in range(options.repeats):
                order = [0, options.num_viewers] if round_number % 2 == 0 else [options.num_viewers, 0]
                for num_viewers in order:
                    viewers = [SseViewer(url, api_key) for _ in range(num_viewers)]
                    try:
                        time.sleep(SETTLE_S)  # let the streams start before the window (not a sync point)
                        samples[num_viewers].append(_window(pid, options.window_s))
                    finally:
                        for viewer in viewers:
                            viewer.close()
                    snapshots += [v.num_snapshots for v in viewers]
                    snapshot_bytes += [v.num_bytes for v in viewers]
                    errors = [v.error for v in viewers if v.error]
                    if errors:
                        raise RuntimeError(f"a dashboard viewer failed: {errors[0]}")
            num_polls = fleet.num_polls
        finally:
            fleet.close()
    idle = statistics.median(samples[0])
    viewed = statistics.median(samples[options.num_viewers])
    return {
        "num_instances": options.num_instances,
        "num_viewers": options.num_viewers,
        "window_s": options.window_s,
        "repeats": options.repeats,
        "cpu_pct_samples": {str(k): v for k, v in samples.items()},
        "cpu_pct_no_viewer": idle,
        "cpu_pct_viewers": viewed,
        "cpu_pct_difference": viewed - idle,
        "snapshots_per_viewer": snapshots,
        "kb_per_snapshot": sum(snapshot_bytes) / max(1, sum(snapshots)) / 1e3,
        "stats_polls_answered": num_polls,
    }
