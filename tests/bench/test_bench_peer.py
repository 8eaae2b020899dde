"""`bench.py peer` end to end: a second real minipd (`--role both --model tiny`) stands in for
the peer (CI builds no llama-server), so this checks the harness, not who is faster: both
sides' figures for every workload and concurrency, ratios computed from exactly those figures,
every request completed, table and plot written; and with no peer, a clear refusal."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.loadgen.deployments import start_server
from benchmarks.loadgen.plotting import PNG_MAGIC
from benchmarks.loadgen.processes import Processes, minipd_command
from benchmarks.peer.peer_bench import FIGURES, QUICK, SIDES

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def peer_url():
    with Processes() as processes:
        argv = [*minipd_command(), "--role", "both", "--port", "0", "--model", "tiny", "--torch-threads", "1"]
        yield start_server(processes, "peer-standin", argv)


def bench(*flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "bench.py", "peer", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )


@pytest.mark.timeout(180)
def test_peer_reports_both_sides_and_their_ratios(tmp_path, peer_url):
    out, png = tmp_path / "peer.json", tmp_path / "peer.png"
    run = bench("--quick", "--no-progress", "--peer-url", peer_url, "--json", str(out), "--plot", str(png))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["peer_url"] == peer_url and result["minipd_started"] and result["minipd_url"] != peer_url
    cells = {(c["workload"], c["concurrency"]): c for c in result["cells"]}
    assert set(cells) == {(w, c) for w in QUICK["workloads"] for c in QUICK["concurrencies"]}
    for (workload, concurrency), cell in cells.items():
        for side in SIDES:
            figures = cell[side]
            assert all(math.isfinite(figures[name]) and figures[name] > 0 for name, _, _ in FIGURES), (side, cell)
            # every request of every repeat completed, on both servers
            assert figures["failed"] == 0
            assert figures["completed"] == figures["num_requests"] == cell["num_prompts"] * cell["repeats"]
            assert len(cell["runs"][side]) == cell["repeats"]
        for name, _, _ in FIGURES:
            assert cell["ratio"][name] == pytest.approx(cell["minipd"][name] / cell["peer"][name], rel=1e-9)
        assert f"{workload:<14}{concurrency:>5}" in run.stdout  # its table row
    assert "ratios are minipd / peer" in run.stdout
    assert png.read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC


def test_no_peer_runs_nothing_and_says_why(tmp_path):
    out = tmp_path / "peer.json"
    run = bench("--quick", "--json", str(out))
    assert run.returncode == 2
    assert "nothing ran: no peer given" in run.stderr and "--peer-url" in run.stderr
    assert not out.exists()


@pytest.mark.timeout(180)
def test_peer_binary_is_started_pinned_like_minipd_and_stopped(tmp_path):
    """`--peer-binary`: the bench starts the peer with llama-server's flags on the given GGUF file,
    pinned to the peer's cores with minipd's thread count and a slot per request in flight,
    measures it, and stops it at the end."""
    record, model = tmp_path / "record.json", tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")  # the stand-in serves tiny; the bench only checks the file is there
    binary = tmp_path / "llama-server"
    binary.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} {ROOT}/tests/support/peer_standin.py "$@"\n')
    binary.chmod(0o755)
    peer_cpu = sorted(os.sched_getaffinity(0))[-1]
    out = tmp_path / "peer.json"
    run = bench(
        "--quick",
        "--no-progress",
        "--peer-binary",
        str(binary),
        "--peer-model",
        str(model),
        "--peer-cpus",
        str(peer_cpu),
        "--json",
        str(out),
        env={**os.environ, "PEER_STANDIN_RECORD": str(record)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    started = json.loads(record.read_text())
    assert result["peer_started"] == str(binary) and result["peer_model"] == str(model)
    assert started["m"] == str(model) and started["cpus"] == [peer_cpu]
    assert started["t"] == started["tb"] == 1  # --torch-threads, minipd's default here
    assert started["np"] == max(QUICK["concurrencies"])
    assert result["peer_url"] == f"http://127.0.0.1:{started['port']}"
    assert all(c["peer"]["completed"] == c["peer"]["num_requests"] > 0 for c in result["cells"])
    with pytest.raises(ProcessLookupError):  # stopped with the bench
        os.kill(started["pid"], 0)


def test_peer_binary_needs_a_gguf_file(tmp_path):
    run = bench("--quick", "--peer-binary", "/bin/true")  # --quick serves tiny, which has no GGUF file
    assert run.returncode == 2
    assert "--peer-binary" in run.stderr and "not a GGUF file" in run.stderr


def test_peer_url_and_binary_exclude_each_other():
    run = bench("--quick", "--peer-url", "http://127.0.0.1:1", "--peer-binary", "/bin/true")
    assert run.returncode == 2 and "not both" in run.stderr
