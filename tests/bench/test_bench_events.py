"""`python bench.py events --quick`: the request event seam's cost per request, with no
subscriber and with one of every kind, against a request through an in-process cluster timed in
the same run (strict JSON, a table, a PNG)."""

from __future__ import annotations

import pytest
from test_bench_serving import bench, finite


@pytest.mark.timeout(300)
def test_events_bench_times_the_seam_against_a_request(tmp_path):
    result, stdout = bench(tmp_path, "events")
    assert finite(result["no_subscriber_us"], result["every_kind_subscriber_us"], result["request_ms"])
    assert result["publishes_per_request"] == result["event_kinds"] - 1 + result["max_tokens"]
    # a built and delivered event costs more than a look-up that finds no handler
    assert result["every_kind_subscriber_us"] > result["no_subscriber_us"] > 0
    assert 0 < result["no_subscriber_share"] < result["every_kind_subscriber_share"]
    assert "no subscriber" in stdout and "of a request" in stdout
