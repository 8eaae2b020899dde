"""`python bench.py soak --quick`: a mixed workload while the router is paused past the liveness
bound, an instance is paused past it and an instance is killed (restarted by the launcher's
supervisor, nothing re-registered by hand) loses no request, leaks no block, reports for every
fault the time until the cluster served at full capacity again, and every process's resident
memory at start and end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIVENESS_S = 3.0  # the soak's default --liveness-timeout-s
# From the end of a fault to full capacity: after a pause, readmission is a redial (measured
# well under 1 s); after a kill, the supervisor's 0.5 s backoff and a fresh process importing
# torch on a busy 2-core machine (measured about 2 s). The rest is margin.
RECOVERY_BOUND_S = {"router-pause": LIVENESS_S + 5.0, "instance-pause": LIVENESS_S + 5.0, "kill": 30.0}


@pytest.mark.timeout(300)
def test_quick_soak_loses_nothing_leaks_nothing_recovers_from_each_fault_and_reports_memory(tmp_path):
    out, png = tmp_path / "soak.json", tmp_path / "soak.png"
    run = subprocess.run(
        [sys.executable, "bench.py", "soak", "--quick", "--json", str(out), "--plot", str(png)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["lost"] == 0, result["lost_examples"]
    assert result["leaked_blocks"] == 0, result["instances_after"]
    assert result["completed"] + result["failed"] == result["requests"] > 0
    assert result["completed"] > 0
    assert all(reason.strip() for reason in result["failure_reasons"])
    assert "completed" in run.stdout and "leaked blocks" in run.stdout
    _assert_every_fault_recovered(result, run.stdout)
    _assert_rss_sane(result, run.stdout)


def _assert_every_fault_recovered(result: dict, stdout: str) -> None:
    events = result["chaos"]
    assert {e["kind"] for e in events} == set(RECOVERY_BOUND_S), events
    for e in events:
        assert e["recovery_s"] is not None and e["error"] is None, e
        assert 0 <= e["recovery_s"] < RECOVERY_BOUND_S[e["kind"]], e
        if e["kind"] == "kill":
            assert e["fault_s"] == 0 and e["target"] != "router", e
        else:  # a pause past the liveness bound: the other side had to notice it
            assert e["fault_s"] > LIVENESS_S, e
        if e["kind"] == "instance-pause":
            assert e["dropped"] is True and e["target"] != "router", e  # declared lost, then readmitted
        if e["kind"] == "router-pause":
            assert e["target"] == "router", e
    # the killed instances were replaced by the launcher's supervisor: new processes
    killed = {e["target"] for e in events if e["kind"] == "kill"}
    assert killed and all(result["rss_mb"][name]["restarted"] for name in killed), result["rss_mb"]
    for kind, figures in result["recovery_s"].items():
        times = [e["recovery_s"] for e in events if e["kind"] == kind]
        assert figures["faults"] == len(times) and figures["max_s"] == max(times), (kind, figures)
        assert figures["median_s"] <= figures["max_s"], (kind, figures)
    assert set(result["recovery_s"]) == set(RECOVERY_BOUND_S), result["recovery_s"]
    assert "full capacity after" in stdout and "NEVER" not in stdout


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
    assert result["rss_growth_mb"] <= result["max_rss_growth_mb"] and result["checks_failed"] == [], result[
        "checks_failed"
    ]
    assert "rss start MB" in stdout
