"""`bench.py switch`, `controller` and `validate` end to end with `--quick`: each exits 0, writes
strict JSON with finite numbers in the fields the docs name, and a PNG; no request is lost.
(The harness, not the speed: quick runs use the tiny model and a handful of requests.)"""

from __future__ import annotations

import pytest
from test_bench_serving import bench, finite


@pytest.mark.timeout(300)
def test_switch_times_both_directions_under_load(tmp_path):
    result, stdout = bench(tmp_path, "switch")
    summary = result["models"]["tiny"]["summary"]
    assert set(summary) == {"decode->prefill", "prefill->decode"}
    for s in summary.values():
        assert finite(
            s["median_total_s"], s["median_drain_s"], s["median_excluding_drain_s"], s["median_first_token_s"]
        )
        assert s["median_excluding_drain_s"] <= s["median_total_s"]
    for row in result["models"]["tiny"]["switches"]:
        assert row["lost_requests"] == 0 and isinstance(row["num_drained"], int)
    assert result["lost_requests"] == 0 and isinstance(result["meets_target"], bool)
    assert "excl. drain" in stdout


@pytest.mark.timeout(300)
def test_controller_against_a_fixed_ratio_on_the_shift_workload(tmp_path):
    result, stdout = bench(tmp_path, "controller")
    for name in ("fixed", "controller"):
        run = result[name]
        assert finite(run["attainment_first_half"], run["attainment_second_half"], run["attainment"])
        assert len(run["requests"]["ttft_ms"]) == result["num_requests"]
    assert 0 < result["num_first_half"] < result["num_requests"]
    for change in result["role_changes"]:
        assert finite(change["t"]) and change["from"] != change["to"] and change["instance"]
    assert result["lost_requests"] == 0
    assert sorted(result["final_roles"]) == ["decode-0", "prefill-0", "prefill-1"]
    assert "second half:" in stdout


@pytest.mark.timeout(300)
def test_validate_compares_simulated_and_measured_figures(tmp_path):
    result, stdout = bench(tmp_path, "validate")
    assert set(result["workloads"]) == {"prefill-heavy", "decode-heavy"}
    for workload in result["workloads"].values():
        for row in workload["runs"]:
            for side in ("simulated", "measured"):
                assert finite(
                    *(row[side][m] for m in ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms", "attainment"))
                )
            assert finite(*row["relative_error"].values(), row["attainment_diff"])
            for other in ("predicted", "profile_only"):
                assert finite(*row[other]["relative_error"].values(), row[other]["attainment_diff"])
            for role in ("prefill", "decode"):  # the run's own speed, from its instances' logged steps
                speed = row["speed"][role]
                assert finite(*speed.values()) and speed["points"] > 0 and 0 < speed["p10"] <= speed["p90"]
        pooled = workload["pooled"]  # every run's requests together
        assert pooled["num_requests"] == workload["num_requests"] * len(workload["runs"])
        assert finite(*pooled["relative_error"].values(), pooled["attainment_diff"])
    probe = result["serving_path_probe"]
    assert finite(*probe.values()) and probe["request_overhead_ms"] >= 0 and probe["decode_join_delay_ms"] >= 0
    serving = result["serving_profile"]  # fitted to the instances' own steps during the calibration runs
    assert serving["prefill_steps"] >= 3 and serving["decode_steps"] >= 3
    assert finite(*serving["prefill"].values(), *serving["decode"].values())
    for jitter in result["serving_jitter"].values():
        assert finite(jitter["sigma_slow"], jitter["tau_s"], jitter["sigma_step"]) and jitter["tau_s"] > 0
    assert result["lost_requests"] == 0
    assert "attainment" in stdout and "serving-path probe" in stdout
