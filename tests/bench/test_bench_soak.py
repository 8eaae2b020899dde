"""`python bench.py soak --quick`: a mixed workload while instances are killed and frozen loses
no request and leaks no block."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_quick_soak_loses_nothing_and_leaks_nothing(tmp_path):
    out, png = tmp_path / "soak.json", tmp_path / "soak.png"
    run = subprocess.run(
        [sys.executable, "bench.py", "soak", "--quick", "--json", str(out), "--plot", str(png)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["lost"] == 0, result["lost_examples"]
    assert result["leaked_blocks"] == 0, result["instances_after"]
    assert result["completed"] + result["failed"] == result["requests"] > 0
    assert result["completed"] > 0
    assert {e["kind"] for e in result["chaos"]} == {"kill", "freeze"}, result["chaos"]
    assert all(reason.strip() for reason in result["failure_reasons"])
    assert "completed" in run.stdout and "leaked blocks" in run.stdout
