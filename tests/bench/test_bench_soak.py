"""`python bench.py soak --quick`: a mixed workload while instances are killed and frozen loses
no request, leaks no block, and reports every process's resident memory at start and end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_quick_soak_loses_nothing_and_leaks_nothing_and_reports_memory(tmp_path):
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
    _assert_rss_sane(result, run.stdout)


def _assert_rss_sane(result: dict, stdout: str) -> None:
    rss = result["rss_mb"]
    assert set(rss) >= {"router", "prefill-0", "prefill-1", "decode-0", "decode-1"}, rss
    for name, r in rss.items():
        # an instance holds torch and a model: tens of MB at least, and far below this machine's RAM
        assert 20 < r["start_mb"] < 8192 and 20 < r["end_mb"] < 8192, (name, r)
    kept = [r for r in rss.values() if not r["restarted"]]
    assert result["rss_processes_checked"] == len(kept) > 0, rss  # the router is never killed
    growths = [r["end_mb"] - r["start_mb"] for r in kept]
    assert result["rss_growth_mb"] == pytest.approx(max(growths), abs=0.2)
    assert result["rss_growth_mb"] <= result["max_rss_growth_mb"] and result["checks_failed"] == []
    assert "rss start MB" in stdout
