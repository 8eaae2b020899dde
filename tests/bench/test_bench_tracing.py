"""`bench.py tracing --quick`: both clusters serve the sweep, the traced one's spans reach the
sink, and the JSON holds finite ratios traced / untraced."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 280


def test_tracing_quick(tmp_path):
    out = tmp_path / "tracing.json"
    run = subprocess.run(
        [sys.executable, "bench.py", "tracing", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["modes"]) == {"tracing_off", "tracing_on"}
    for mode in result["modes"].values():
        assert sum(mode["num_requests"]) > 0 and sum(mode["num_failed"]) == 0, mode
    assert result["exported"]["posts"] > 0 and result["exported"]["bytes"] > 0
    ratios = result["ratio_on_over_off"]
    assert ratios["p90_ttft"] and all(math.isfinite(r) and r > 0 for r in ratios["p90_ttft"])
    assert len(ratios["p90_itl"]) == len(ratios["p90_ttft"])  # null where the untraced P90 ITL was 0
    assert "traced / untraced P90 TTFT" in run.stdout
