"""`bench.py viewers --quick`: the router takes 64 fake instances, the viewers receive snapshots in
both parts, and the JSON holds finite CPU figures and finite latency ratios viewed / unviewed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 280


def test_viewers_quick(tmp_path):
    out, png = tmp_path / "viewers.json", tmp_path / "viewers.png"
    run = subprocess.run(
        [sys.executable, "bench.py", "viewers", "--quick", "--json", str(out), "--plot", str(png)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["checks_failed"] == []

    cpu = result["router_cpu"]
    assert cpu["num_instances"] == 64 and cpu["num_viewers"] == 2
    for key in ("cpu_pct_no_viewer", "cpu_pct_viewers", "cpu_pct_difference"):
        assert math.isfinite(cpu[key]), key
    assert cpu["cpu_pct_no_viewer"] >= 0 and cpu["cpu_pct_viewers"] >= 0
    assert len(cpu["cpu_pct_samples"]["0"]) == len(cpu["cpu_pct_samples"]["2"]) == cpu["repeats"]
    # two viewers per viewed window, each received at least one snapshot event
    assert len(cpu["snapshots_per_viewer"]) == 2 * cpu["repeats"] and min(cpu["snapshots_per_viewer"]) >= 1
    assert cpu["kb_per_snapshot"] > 0
    assert cpu["stats_polls_answered"] >= 64  # every fake instance was polled by the router

    assert set(result["modes"]) == {"no_viewer", "viewers"}
    for mode in result["modes"].values():
        assert sum(mode["num_requests"]) > 0 and sum(mode["num_failed"]) == 0, mode
    ratios = result["ratio_viewed_over_unviewed"]
    assert ratios["p90_ttft"] and all(math.isfinite(r) and r > 0 for r in ratios["p90_ttft"])
    assert len(ratios["p90_itl"]) == len(ratios["p90_ttft"])
    snapshots = result["snapshots_per_viewer"]
    assert len(snapshots) == 2 * len(ratios["p90_ttft"]) and min(snapshots) >= 1
    assert png.stat().st_size > 0
    assert "viewed / unviewed P90 TTFT" in run.stdout
