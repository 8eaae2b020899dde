"""`--shutdown-timeout-s` bounds the whole stop, whatever the trace exporter does: with
`--otlp-traces-endpoint` pointing at a collector that accepts connections and never answers
(black_hole.py), and spans stuck on their way there, SIGINT stops a router, an instance and
a `--role cluster` launcher with its children within the bound, with the status of a normal
shutdown (0), and each traced process logs one line saying its exporter was dropped.

Two figures per process: the stop's own end, the `trace exporter dropped` line, logged at
most STOP_SLACK_S past the bound after the signal; and the process's exit, which adds the
interpreter's own (its heap frozen once serving, entrypoints/stop_signal.py `settle_heap`):
on 2 cores shared with other runs (load 11), bound 2 s, a router and an instance exited
after 2.3 s, a launcher with its three children after 3.4 s. Without the bound the SDK's
flush waited on the collector for its 10 s export timeout: a colocated instance took 11 s,
a launcher 15 s; and a launcher's child took 3 to 5 s more to exit before its heap was frozen."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime

import pytest
from black_hole import BlackHole
from http_helpers import http_json
from launcher_process import Launcher
from minipd_process import Process

from minipd.tracing.exporter import DROPPED

BOUND_S = 2.0
STOP_SLACK_S = 1.0  # signal delivery and the stop's own steps (a launcher relays the signal) on busy cores
EXIT_SLACK_S = 2.0  # the interpreter's exit after the stop: 0.3 s seen on 2 busy cores
LAUNCHER_EXIT_SLACK_S = 3.0  # its children's exits, then its own: 1.4 s seen
CONNECT_WAIT_S = 30.0
EXIT_WAIT_S = 60.0  # how long a test waits for an exit at all (unbounded before the fix: 11 to 15 s)
MODEL = ["--model", "tiny", "--shutdown-timeout-s", str(BOUND_S)]
SECRET = "shutdown-bound-secret"
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # logging's asctime, the first 23 characters of a line


@pytest.fixture
def hole(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # spans leave at once: stuck on their way
    hole = BlackHole()
    yield hole
    hole.close()


def _wait_connections(hole: BlackHole, count: int) -> None:
    """Until `count` exporters have connected to the black hole (each is stuck waiting on it)."""
    deadline = time.monotonic() + CONNECT_WAIT_S
    while hole.num_connections < count:
        assert time.monotonic() < deadline, f"{hole.num_connections} of {count} exporters connected"
        time.sleep(0.05)  # a condition poll on other processes' connects, bounded by the deadline


def _interrupt(popen: subprocess.Popen) -> tuple[float, int, float]:
    """SIGINT: (when it was sent, time.time(); the exit status; seconds until the exit)."""
    sent_at, start = time.time(), time.monotonic()
    popen.send_signal(signal.SIGINT)
    status = popen.wait(EXIT_WAIT_S)
    return sent_at, status, time.monotonic() - start


def _drops_after(text: str, sent_at: float) -> list[float]:
    """Seconds from `sent_at` to each `trace exporter dropped` line of the log `text`."""
    return [
        datetime.strptime(line[:23], LOG_TIME).timestamp() - sent_at for line in text.splitlines() if DROPPED in line
    ]


def _check(name: str, text: str, sent_at: float, status: int, exit_s: float, num_drops: int, slack_s: float):
    drops = _drops_after(text, sent_at)
    print(f"bound {BOUND_S} s: {name} dropped its exporters after {drops} s, exited after {exit_s:.2f} s")
    assert status == 0, (name, status, text[-3000:])
    assert len(drops) == num_drops, (name, text[-3000:])
    assert all(BOUND_S - STOP_SLACK_S < s < BOUND_S + STOP_SLACK_S for s in drops), (name, drops)
    assert exit_s < BOUND_S + slack_s, (name, exit_s, text[-3000:])


def test_a_router_and_its_instance_stop_within_the_bound(hole, tmp_path):
    traced = ["--otlp-traces-endpoint", hole.endpoint]
    logs = {name: tmp_path / f"{name}.log" for name in ("instance", "router")}
    instance = Process(
        ["--role", "both", "--control-port", "0", "--dtype", "float32", *MODEL, *traced],
        SECRET,
        log=str(logs["instance"]),
    )
    router = None
    try:
        host, port = instance.address
        router = Process(
            ["--role", "router", "--port", "0", "--http-port", "0", "--colocated", f"{host}:{port}", *MODEL, *traced],
            SECRET,
            log=str(logs["router"]),
        )
        answer = http_json("POST", f"{router.http_url}/v1/completions", {"prompt": "spans", "max_tokens": 3})
        assert answer.status == 200, answer.body
        _wait_connections(hole, 2)
        stopped = {"router": _interrupt(router.popen), "instance": _interrupt(instance.popen)}
    finally:
        for process in (router, instance):
            if process is not None:
                process.stop()
    for name, (sent_at, status, exit_s) in stopped.items():
        _check(name, logs[name].read_text(), sent_at, status, exit_s, 1, EXIT_SLACK_S)


def test_a_launcher_stops_its_traced_cluster_within_the_bound(hole):
    launcher = Launcher(*MODEL, "--dtype", "float32", "--otlp-traces-endpoint", hole.endpoint, env=dict(os.environ))
    try:
        launcher.ready()
        prompt = "the KV of this prompt goes from prefill to decode " * 4  # past the local-prefill threshold
        answer = http_json("POST", f"{launcher.base_url}/v1/completions", {"prompt": prompt, "max_tokens": 3})
        assert answer.status == 200, answer.body
        _wait_connections(hole, 3)  # the router's, the prefill instance's and the decode instance's exporters
        sent_at, _, exit_s = _interrupt(launcher.process)
        status = launcher.exit_status(LAUNCHER_EXIT_SLACK_S)
    finally:
        launcher.stop()
    _check("the launcher", launcher.output(), sent_at, status, exit_s, 3, LAUNCHER_EXIT_SLACK_S)
