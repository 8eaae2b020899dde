"""Every `bench.py` experiment end to end with `--quick`: it exits 0, its JSON holds finite
numbers in the fields docs/benchmarks.md names, and its plot is a PNG. (This checks the
harness, not the speed: the quick runs use the tiny model and a handful of requests.)"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.loadgen.netns import unavailable_reason
from benchmarks.loadgen.plotting import PNG_MAGIC

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 280


def bench(tmp_path: Path, experiment: str, *flags: str) -> tuple[dict, str]:
    out, png = tmp_path / f"{experiment}.json", tmp_path / f"{experiment}.png"
    run = subprocess.run(
        [sys.executable, "bench.py", experiment, "--quick", "--json", str(out), "--plot", str(png), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert png.read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    return json.loads(out.read_text()), run.stdout


def finite(*values) -> bool:
    flat = [v for value in values for v in (value if isinstance(value, list) else [value])]
    return bool(flat) and all(isinstance(v, (int, float)) and math.isfinite(v) for v in flat)


@pytest.mark.timeout(300)
def test_serve_prints_the_vllm_summary(tmp_path):
    result, stdout = bench(tmp_path, "serve", "--goodput", "ttft:5000", "tpot:1000")
    summary = result["summary"]
    assert summary["completed"] == result["workload"]["num_prompts"] == 8 and summary["failed"] == 0
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert finite(*(summary[metric][k] for k in ("mean", "median", "p50", "p90", "p99")))  # seconds
    assert finite(summary["request_throughput"], summary["request_goodput"], summary["attainment"])
    assert result["prompt_len_mismatches"] == 0  # the server counted every prompt at the requested length
    assert all(r["prompt_tokens"] == r["prompt_len"] for r in result["requests"])
    assert "Serving Benchmark Result" in stdout and "Mean TTFT (ms):" in stdout


def write_sharegpt(path: Path, num_conversations: int) -> None:
    conversations = [
        {
            "id": f"c{i}",
            "conversations": [
                {
                    "from": "human",
                    "value": f"Question {i}: how long does the ferry crossing take when the sea is calm?",
                },
                {"from": "gpt", "value": "About forty minutes."[: 8 + i]},
            ],
        }
        for i in range(num_conversations)
    ]
    conversations.append({"id": "no-reply", "conversations": [{"from": "human", "value": "unanswered"}]})
    path.write_text(json.dumps(conversations))


@pytest.mark.timeout(300)
def test_serve_takes_its_prompts_from_a_sharegpt_file(tmp_path):
    dataset = tmp_path / "conversations.json"
    write_sharegpt(dataset, 10)
    result, _ = bench(tmp_path, "serve", "--dataset", str(dataset))
    rows = result["requests"]
    assert len(rows) == 8 and all(r["success"] for r in rows)
    # byte-level model: each answer's length in bytes (8 + i, all different) is its output length
    outputs = [r["output_tokens"] for r in rows]
    assert len(set(outputs)) == 8 and set(outputs) <= set(range(8, 18))
    assert all(r["prompt_tokens"] == r["prompt_len"] for r in rows)


@pytest.mark.timeout(300)
def test_slo_reports_both_modes_and_both_slos(tmp_path):
    result, stdout = bench(tmp_path, "slo")
    assert set(result["slo"]) == {"itl_tight", "ttft_tight"}
    assert set(result["modes"]) == {"colocated", "disaggregated"}
    for mode in result["modes"].values():
        n = len(mode["rates"])
        assert n >= 1 and finite(mode["rates"], mode["p90_ttft_ms"], mode["p90_itl_ms"])
        assert len(mode["p90_ttft_ms"]) == len(mode["p90_itl_ms"]) == n
        for name in result["slo"]:
            assert len(mode["attainment"][name]) == n and finite(mode["attainment"][name])
            assert finite(mode["goodput_rps"][name])
    assert "goodput colocated" in stdout and "goodput disaggregated" in stdout


@pytest.mark.timeout(300)
def test_linkbw_names_the_failing_bandwidth_for_each_method(tmp_path):
    result, stdout = bench(tmp_path, "linkbw")
    methods = {"bucket"} | ({"netns"} if unavailable_reason() is None else set())
    assert set(result["methods"]) == methods
    for method in result["methods"].values():
        assert finite(method["link_gbps"], method["p90_ttft_ms"], method["attainment"])
        assert method["attainment"][-1] == 0.0  # starved: each transfer outlasts the TTFT SLO
        assert finite(method["threshold_gbps"]), method
        assert method["first_failing_gbps"] <= method["threshold_gbps"] <= method["last_passing_gbps"]
    assert "the TTFT SLO fails below" in stdout


@pytest.mark.timeout(300)
def test_crossover_gives_measured_and_modelled_curves(tmp_path):
    result, _ = bench(tmp_path, "crossover")
    assert result["prompt_len"] == [512, 1024]
    assert finite(
        result["crossover_gbps_measured"], result["crossover_gbps_model"], result["interference_ms"], result["kv_bytes"]
    )
    assert result["kv_bytes"][1] > result["kv_bytes"][0]  # twice the prompt, twice the KV


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "experiment, fields",
    [
        ("transport", ("memcpy_gbps", "raw_socket_gbps")),
        ("overlap", ("ideal_hidden_fraction",)),
    ],
)
def test_the_baseline_experiments_run_quick_and_plot(tmp_path, experiment, fields):
    result, _ = bench(tmp_path, experiment)
    assert finite(*(result[f] for f in fields))
