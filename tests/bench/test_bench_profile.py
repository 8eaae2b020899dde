"""`python bench.py profile --quick` on the tiny model, in process: a profile JSON the planner
loads, with finite, non-negative coefficients that make every step cost something."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from minipd.ops.planner.latency_profile import LatencyProfile

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # bench.py imports benchmarks.* from the repository root
    spec = importlib.util.spec_from_file_location("bench_main", ROOT / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    yield module
    torch.set_num_threads(threads)  # the experiment sets it for this process


@pytest.mark.timeout(120)
def test_profile_quick_writes_a_loadable_profile(bench, tmp_path, capsys) -> None:
    out, png = tmp_path / "profile.json", tmp_path / "profile.png"
    argv = ["profile", "--quick", "--model", "tiny", "--torch-threads", "1", "--json", str(out), "--plot", str(png)]
    assert bench.main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text())
    for part in ("prefill", "decode"):
        coefs = [data[part][k] for k in "abc"]
        assert all(math.isfinite(c) and c >= 0 for c in coefs), coefs
        assert data[part]["a"] > 0  # every step has a fixed cost
        assert data[f"{part}_fit"]["num_samples"] >= 3 and math.isfinite(data[f"{part}_fit"]["rmse_s"])
    profile = LatencyProfile.load(out)
    assert profile.source == "measured" and profile.model == "tiny" and profile.threads == 1
    # a longer prompt costs more (through the per-token or the attention term: on a busy machine the
    # fit of six samples may put all of the growth in either)
    assert profile.prefill.b > 0 or profile.prefill.c > 0
    assert profile.prefill.prompt_s(512) > profile.prefill.prompt_s(64) > profile.prefill.a
    assert profile.kv_bytes_per_token == 2 * 4 * 2 * 32 * 4  # tiny: 4 layers, 2 KV heads, head_dim 32, fp32
    assert len(profile.prefill_samples) == 6 and len(profile.decode_samples) == 6
    # the fit explains its own samples to within the stated worst relative error
    for s in profile.decode_samples:
        predicted = profile.decode.step_s(sum(s.context_lens), len(s.context_lens))
        assert abs(predicted - s.seconds) <= profile.decode_fit.max_rel_error * s.seconds * (1 + 1e-9)
    assert "latency profile of tiny" in capsys.readouterr().out
