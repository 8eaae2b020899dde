"""`bench.py dashboard --quick` end to end: a real Prometheus scraped a live cluster under load,
every panel of the shipped dashboard came back with series over the run, the load switched
roles (both switches answered 200) and the JSON is strict; the plot is a PNG."""

from __future__ import annotations

import math

import pytest
from test_bench_serving import bench

from benchmarks.dashboard.prometheus_server import load_dashboard


@pytest.mark.timeout(300)
def test_every_panel_is_drawn_from_query_range_data(tmp_path):
    result, stdout = bench(tmp_path, "dashboard")
    titles = [p["title"] for p in load_dashboard()["panels"]]
    assert [p["title"] for p in result["panels"]] == titles
    assert result["empty_panels"] == [] and not result["checks_failed"]
    for panel in result["panels"]:
        for target in panel["targets"]:
            for series in target["series"]:
                assert len(series["t"]) == len(series["v"]) > 0, panel["title"]
                assert all(v is None or (math.isfinite(v) and v >= 0) for v in series["v"]), panel["title"]
    load = result["load"]
    assert load["completed"] > 0 and load["sent"] == load["completed"] + load["failed"]
    assert [(s["role"], s["status"]) for s in load["switches"]] == [("decode", 200), ("prefill", 200)]
    assert "Ratio controller decisions" in stdout
