"""`python bench.py footprint` end to end: every serving process of a real local cluster records
the package lines one streamed chat runs (its KV crossing from prefill to decode), as strict
JSON, a table and a PNG."""

from __future__ import annotations

import pytest
from test_bench_serving import bench


@pytest.mark.timeout(300)
def test_footprint_counts_what_one_chat_runs_in_each_process(tmp_path):
    result, stdout = bench(tmp_path, "footprint")
    run = result["median_run"]
    for role in ("router", "prefill", "decode"):  # the chat went through all three
        assert run["per_role"][role]["files"] > 0 and run["per_role"][role]["lines_run"] > 0, role
    assert "minipd/router/router.py" in run["files"] and "minipd/disagg/instance_dispatch.py" in run["files"]
    assert not any(f.startswith(("benchmarks/", "tests/")) for f in run["files"])  # the package only
    assert result["files"] == len(run["files"]) and result["file_lines"] >= result["lines_run"] > 0
    assert "file lines by folder" in stdout
