"""`python bench.py engine --quick` (on its default model) and `python bench.py neighbour --quick`
run end to end and write finite figures under the JSON names docs/benchmarks.md uses (a short
run: this checks the harness, not the speed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from gguf_helpers import TINY, hf_weights, write_llama_gguf

from minipd.models.kernels import vnni_kernels

ROOT = Path(__file__).resolve().parents[2]


def _bench(tmp_path, *argv: str) -> dict:
    out, png = tmp_path / "result.json", tmp_path / "result.png"
    run = subprocess.run(
        [sys.executable, "bench.py", *argv, "--json", str(out), "--plot", str(png)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads(out.read_text()), run.stdout


def _finite(value) -> bool:
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


@pytest.mark.timeout(300)
def test_engine_bench_quick_on_its_default_model_writes_finite_figures(tmp_path):
    """As documented, on the default model (SmolLM2, served 4-bit): its HF comparison loads the
    same file dequantized."""
    result, stdout = _bench(tmp_path, "engine", "--quick")
    assert result["model"] == "smollm2" and result["weights"] != "dense"
    assert _finite(result)
    for key in (
        "serving_tok_s",
        "hf_static_tok_s",
        "speedup_vs_hf_static",
        "serving_cpu_tok_s",
        "hf_static_cpu_tok_s",
        "overhead_vs_raw",
        "ratio_to_floor",
        "bf16_tok_s",
        "fp32_tok_s",
        "bf16_speedup",
        "memcpy_gbps",
        "weight_bytes",
    ):
        assert result[key] > 0, key
    assert set(result["decode"]) == {"1", "8"}
    for row in result["decode"].values():
        assert row["engine_step_ms"] > 0 and row["raw_step_ms"] > 0 and row["floor_ms"] > 0
    assert result["targets"]["speedup_vs_hf_static"] == 3.0
    assert "speedup_vs_hf_static" in stdout and "ratio_to_floor" in stdout and "bf16_speedup" in stdout


@pytest.mark.timeout(300)
def test_engine_bench_times_a_quantized_model_against_it_served_dense(tmp_path):
    model = write_llama_gguf(tmp_path / "tiny.gguf", TINY, hf_weights(TINY), GGMLQuantizationType.Q4_1)
    result, stdout = _bench(tmp_path, "engine", "--quick", "--parts", "decode", "--model", str(model))
    assert _finite(result) and result["weights"] == "mixed"
    # the floor counts the 4-bit bytes the step reads; the dense comparison reads bf16
    assert 0 < result["weight_bytes"] < 0.5 * result["dense_weight_bytes"]
    resident = result["resident_weight_bytes"]
    assert 0 < resident["weights"] <= 1.3 * result["gguf_tensor_bytes"]
    # the dense copies (prefill rows) are reported apart: bf16, 2 bytes per 4-bit projection weight
    assert resident["dense_copy"] > 2 * resident["weights"]
    for row in result["decode"].values():
        assert row["dense_engine_step_ms"] > 0 and row["quantized_vs_dense"] > 0
    assert "quantized vs dense" in stdout and "resident weights" in stdout and "dense copies" in stdout
    if vnni_kernels.best() is not None:  # auto is minipd's kernel here, timed against torch's beside it (bf16)
        assert result["quantized_kernel"] == vnni_kernels.best()
        for row in result["decode"].values():
            assert row["torch_kernel_engine_step_ms"] > 0 and row["vnni_vs_torch_kernel"] > 0
        assert f"{vnni_kernels.best()} vs torch's int4 kernel" in stdout


@pytest.mark.timeout(300)
def test_neighbour_bench_quick_writes_finite_figures(tmp_path):
    result, stdout = _bench(tmp_path, "neighbour", "--quick", "--modes", "placement")
    assert _finite(result)
    placement = result["modes"]["placement"]
    assert placement["quiet_itl_ms"] > 0 and placement["noisy_itl_ms"] > 0
    assert len(placement["quiet_itl_ms_runs"]) == len(placement["noisy_itl_ms_runs"]) == result["repeats"]
    assert result["ratio"] == placement["ratio"] and "torch thread" in placement["placement"]
    assert "ratio with placement" in stdout
