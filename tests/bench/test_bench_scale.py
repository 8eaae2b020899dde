"""`bench.py scale --quick` end to end on Ray: strict JSON, a PNG, and the two runs it compares
doing what they are there for. The quick run gives the controller an ITL objective no token
meets, so it wants decode from its first decision: the run with a spare adds a decode
instance, the one without switches a prefill instance; both then give an idle instance back,
and no request is lost. (The harness, not the speed: tiny model, seconds of load.)"""

from __future__ import annotations

import pytest
from test_bench_serving import bench, finite

pytest.importorskip("ray")


@pytest.mark.timeout(400)
def test_scale_against_switch_only_on_a_load_that_peaks(tmp_path):
    result, stdout = bench(tmp_path, "scale")
    scale, switch = result["scale"], result["switch"]
    # with a spare: an instance added, none switched; without: a switch, no add
    assert [(e["action"], e["role"], e["state"]) for e in scale["scale_events"]][:1] == [("add", "decode", "added")]
    assert scale["role_changes"] == [] and scale["peak_instances"] == 4
    assert [(c["from"], c["to"]) for c in switch["role_changes"]][:1] == [("prefill", "decode")]
    # no room for an add until its idle decode pool gave an instance back (the controller, never
    # content with this objective, may then add one into the room that made)
    assert [(e["action"], e["role"]) for e in switch["scale_events"]][:1] == [("remove", "decode")]
    assert switch["peak_instances"] == 3
    for run in (scale, switch):
        # the idle decode pool gave an instance back before the after-requests, which were served
        assert ("remove", "decode", "removed") in [(e["action"], e["role"], e["state"]) for e in run["scale_events"]]
        assert finite(*run["attainment"].values(), run["attainment_run"], run["p90_ttft_ms"], run["p90_itl_ms"])
        assert len(run["requests"]["ttft_ms"]) == result["num_requests"]
        sizes = run["pool_sizes"]
        assert sizes["t"] == sorted(sizes["t"]) and len(sizes["t"]) == len(sizes["prefill"]) == len(sizes["decode"])
        # the integral lies between the smallest cluster the bounds allow and the largest over the run
        assert 2 * run["duration_s"] <= run["instance_seconds"] <= run["peak_instances"] * run["duration_s"]
    assert result["lost_requests"] == 0 and scale["failed"] == switch["failed"] == 0
    assert isinstance(result["scale_beats_switch_at_peak"], bool)
    assert "at the peak, scaling" in stdout
