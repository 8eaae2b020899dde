"""`bench.py peer` end to end: a second real minipd (`--role both --model tiny`) stands in for
the peer (CI builds no llama-server), so this checks the harness, not who is faster: both
sides' figures for every workload and concurrency, ratios computed from exactly those figures,
every request completed, table and plot written; and with no peer, a clear refusal."""

from __future__ import annotations

import json
import math
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


def bench(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "bench.py", "peer", *flags], cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
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
