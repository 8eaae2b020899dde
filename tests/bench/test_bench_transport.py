"""`python bench.py transport` runs end to end and writes the JSON fields docs/benchmarks.md
and the issue name (small sizes: this checks the harness, not the speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_transport_bench_writes_paired_ratios(tmp_path):
    out = tmp_path / "transport.json"
    run = subprocess.run(
        [
            sys.executable,
            "bench.py",
            "transport",
            "--backends",
            "loopback",
            "--request-mib",
            "4",
            "--repeats",
            "2",
            "--rounds",
            "2",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["memcpy_gbps"] > 0 and result["raw_socket_gbps"] > 0
    assert result["rounds"] == 2 and result["repeats"] == 2
    for key in ("backends", "backends_small_blocks"):
        assert set(result[key]) == {"loopback"}
        for measured in result[key].values():
            assert measured["gbps"] > 0 and measured["memcpy_gbps"] > 0
            assert measured["ratio_to_memcpy"] > 0 and measured["ratio_to_raw_socket"] > 0
            assert len(measured["ratio_to_memcpy_per_round"]) == 2
    assert "loopback" in run.stdout
