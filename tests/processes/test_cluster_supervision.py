"""`minipd --role cluster` supervises its children, as users run it (real processes, real
signals): a killed child is logged and restarted, and serves again; a second stop signal
stops every child at once; a launcher that dies, SIGKILL included, leaves no child running;
a child that cannot start gives one error line and exit status 1."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from http_helpers import OpenStream, http_json
from launcher_process import STARTUP_TIMEOUT_S, Launcher, gone, wait_gone

from minipd.entrypoints.restart_epoch import EPOCHS_PER_RESTART

SMALL = ["--num-prefill", "1", "--num-decode", "1", "--shutdown-timeout-s", "1"]
CHILDREN = ("prefill-0", "decode-0", "router")
GONE_BOUND_S = 20.0  # a child's 1 s shutdown deadline, on a busy 2-core machine
RESTART_BOUND_S = 60.0  # the backoff, then a fresh process importing torch
PROMPT = {"prompt": "The KV cache moves", "max_tokens": 4, "ignore_eos": True}


@pytest.fixture
def launcher():
    started: list[Launcher] = []

    def start(*flags: str) -> Launcher:
        started.append(Launcher(*flags))
        return started[-1].ready()

    yield start
    for each in started:
        each.stop()


def _completes(base_url: str) -> dict:
    result = http_json("POST", f"{base_url}/v1/completions", PROMPT)
    assert result.status == 200, result
    assert result.body["usage"]["completion_tokens"] == PROMPT["max_tokens"], result.body
    return result.body


def test_a_second_sigterm_stops_every_child_at_once(launcher):
    cluster = launcher(*SMALL[:4], "--shutdown-timeout-s", "60", "--max-model-len", "2048")
    # a request under way would hold a graceful shutdown until it finished
    stream = OpenStream(cluster.base_url, "/v1/completions", {"prompt": "x", "max_tokens": 2000, "ignore_eos": True})
    try:
        stream.next_event()
        started = time.monotonic()
        cluster.process.send_signal(signal.SIGTERM)
        # a signal sent while the same one is still pending merges with it: the second must
        # come once the first was taken, as a user's second Ctrl-C does
        cluster.wait_line("stderr", r"^minipd cluster: stopping every process gracefully", GONE_BOUND_S)
        cluster.process.send_signal(signal.SIGTERM)
        status = cluster.exit_status(GONE_BOUND_S)
        took = time.monotonic() - started
    finally:
        stream.close()
    assert status == 1, cluster.output()
    assert took < GONE_BOUND_S
    # the launcher exits only once its children are gone: none is left, not even for a moment
    assert [name for name in CHILDREN if not gone(cluster.pids[name])] == [], cluster.output()
    assert any("killing every process now" in line for line in cluster.stderr), cluster.output()


def test_a_sigkilled_launcher_leaves_no_child_running(launcher):
    cluster = launcher(*SMALL)
    cluster.process.kill()
    cluster.process.wait(GONE_BOUND_S)
    left = wait_gone([cluster.pids[name] for name in CHILDREN], GONE_BOUND_S)
    assert left == [], f"still running after {GONE_BOUND_S} s: {left}"


def test_a_killed_instance_is_logged_restarted_and_serves_again(launcher):
    cluster = launcher(*SMALL)
    _completes(cluster.base_url)
    old = cluster.pids["decode-0"]
    killed_at = time.monotonic()
    os.kill(old, signal.SIGKILL)
    cluster.wait_line("stderr", rf"^minipd cluster: decode-0 \(pid {old}\) died \(killed by SIGKILL\)", GONE_BOUND_S)
    new = int(cluster.wait_line("stderr", r"^minipd cluster: decode-0 restarted \(pid (\d+)\)", RESTART_BOUND_S)[1])
    # the only decode instance: a request answered now was decoded by the restarted one
    _completes(cluster.base_url)
    print(f"decode-0 killed -> serving again in {time.monotonic() - killed_at:.1f} s")
    assert new != old and gone(old) and not gone(new)
    assert cluster.process.poll() is None
    # the restarted process started at a new role epoch, and the router knows it by that one
    instances = http_json("GET", f"{cluster.base_url}/admin/instances").body["instances"]
    (decode,) = [i for i in instances if i["instance"] == "decode-0"]
    assert decode["epoch"] == EPOCHS_PER_RESTART, decode


def test_a_killed_router_is_restarted_on_its_ports(launcher):
    cluster = launcher(*SMALL)
    old = cluster.pids["router"]
    killed_at = time.monotonic()
    os.kill(old, signal.SIGKILL)
    cluster.wait_line("stderr", rf"^minipd cluster: router \(pid {old}\) died \(killed by SIGKILL\)", GONE_BOUND_S)
    new = int(cluster.wait_line("stderr", r"^minipd cluster: router restarted \(pid (\d+)\)", RESTART_BOUND_S)[1])
    assert http_json("GET", f"{cluster.base_url}/health").status == 200  # where clients left it
    _completes(cluster.base_url)  # through both instances, connected to the new router
    print(f"router killed -> serving again in {time.monotonic() - killed_at:.1f} s")
    assert new != old and not gone(new)


@pytest.mark.parametrize("flag", [["--exit-on-child-failure"], ["--max-restarts", "0"]], ids=lambda f: f[0])
def test_a_killed_child_ends_the_launcher_when_not_restarted(launcher, flag):
    cluster = launcher(*SMALL, *flag)
    victim = cluster.pids["prefill-0"]
    os.kill(victim, signal.SIGKILL)
    assert cluster.exit_status(GONE_BOUND_S) == 1, cluster.output()
    named = [line for line in cluster.stderr if line.startswith(f"minipd cluster: prefill-0 (pid {victim}) died")]
    assert len(named) == 1 and "killed by SIGKILL" in named[0], cluster.output()
    assert [name for name in CHILDREN if not gone(cluster.pids[name])] == [], cluster.output()


def _busy_port() -> tuple[socket.socket, list[str], str]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder, ["--http-port", str(holder.getsockname()[1])], "address already in use"


@pytest.mark.parametrize("case", ["busy HTTP port", "max-model-len beyond the model"])
def test_a_child_that_cannot_start_gives_one_error_line(case):
    holder = None
    if case == "busy HTTP port":
        holder, flags, problem = _busy_port()
    else:  # the tiny model has 2048 positions; the launcher cannot know it without loading it
        flags, problem = ["--max-model-len", "4096"], "max_position_embeddings (2048)"
    try:
        cluster = Launcher(*SMALL, *flags)
        try:
            status = cluster.exit_status(STARTUP_TIMEOUT_S)
        finally:
            cluster.stop()
    finally:
        if holder is not None:
            holder.close()
    assert status == 1, cluster.output()
    errors = [line for line in cluster.stderr if "error" in line.lower() or "fail" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("minipd cluster: ") and problem in errors[0], cluster.output()
    assert "Traceback" not in "\n".join(cluster.stderr), cluster.output()
