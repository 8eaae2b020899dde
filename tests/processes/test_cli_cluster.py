"""`minipd --role cluster`: the README's main job, and a clean Ctrl-C."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys

import pytest

CLUSTER = [
    sys.executable,
    "-m",
    "minipd",
    "--role",
    "cluster",
    "--num-prefill",
    "1",
    "--num-decode",
    "1",
    "--transport",
    "tcp",
]
RUN_TIMEOUT_S = 120


def test_main_job_answers_prompts_with_latency_and_transfer_figures():
    long_prompt = "Prefill is compute-bound; decode is bandwidth-bound. The KV cache moves between them."
    proc = subprocess.run(
        [*CLUSTER, "--prompt", "Hello, minipd", "--prompt", long_prompt, "--max-tokens", "12"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "cluster ready (tcp KV transport)" in out and "router: 127.0.0.1:" in out
    assert out.count("output (12 tokens, finish=length)") == 2
    assert out.count("TTFT ") == 2 and "ITL mean" in out
    assert re.search(r"KV prefill-0 -> decode-0: [\d.]+ KiB, prefill compute [\d.]+ ms, transfer", out)
    for role in ("prefill", "decode"):  # each instance says which dtype it serves and why
        assert re.search(rf"minipd {role}: model tiny loaded in [\d.]+ s, dtype \w+ \(", proc.stderr), proc.stderr


def test_ctrl_c_stops_every_process():
    proc = subprocess.Popen(CLUSTER, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("serving;"):
                break
        ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", "".join(lines))]
        assert len(ports) == 3, lines  # prefill, decode, router
        proc.send_signal(signal.SIGINT)
        assert proc.wait(RUN_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
