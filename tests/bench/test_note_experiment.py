"""`python -m benchmarks.browser.note_experiment` on `tiny`, scaled down: the three moves are made
from the page (the cluster flips to colocated and back to 1P:1D, the prefill link is capped),
every move's load run completes, and a starved link makes the run's TTFT longer than the split's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 300
STARVE_GBPS = 0.02  # 2.5 MB/s: a tiny request's ~0.7 MB of KV takes ~0.3 s on it


def test_the_three_moves_from_the_page(tmp_path):
    out, png, shots = tmp_path / "note.json", tmp_path / "note.png", tmp_path / "shots"
    argv = ["--model", "tiny", "--rate", "2", "--num-requests", "8", "--duration-s", "10"]
    argv += ["--starve-gbps", str(STARVE_GBPS), "--json", str(out), "--plot", str(png), "--screenshots", str(shots)]
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.browser.note_experiment", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-10000:]
    result = json.loads(out.read_text())
    assert result["console_errors"] == []
    moves = {m["move"]: m for m in result["moves"]}
    assert list(moves) == ["mixed", "split", "starved"]
    # what the page answered to each move's control
    assert moves["mixed"]["setting"].startswith("0P:0D + 2 colocated")
    assert moves["split"]["setting"].startswith("1P:1D + 0 colocated")
    assert moves["starved"]["setting"] == f"capped at {STARVE_GBPS} Gbit/s"
    for move in moves.values():
        assert move["completed"] >= 1 and move["failed"] == 0, move
        assert move["verdict"] in ("met", "violated"), move
        assert move["run_p90_ttft_ms"] > 0 and move["run_p90_itl_ms"] > 0
    # colocated moves no KV between instances; the split does
    assert moves["split"]["page"]["h-kv"] != "–"
    # the starved link is on every request's path to its first token
    assert moves["starved"]["run_p90_ttft_ms"] > moves["split"]["run_p90_ttft_ms"] + 100.0
    assert png.stat().st_size > 0
    assert sorted(p.name for p in shots.iterdir()) == ["note_mixed.png", "note_split.png", "note_starved.png"]
