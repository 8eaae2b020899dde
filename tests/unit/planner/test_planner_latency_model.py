"""The latency model: the fit recovers known coefficients, never goes negative, profiles
round-trip through JSON, KV sizing agrees with the engine's own pool layout, and the
roofline profiles behave like the hardware they describe."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from minipd.engine.kv_pool import block_bytes
from minipd.models.arch.model_config import PRESETS
from minipd.ops.planner.kv_sizing import kv_bytes_per_token, kv_capacity_tokens
from minipd.ops.planner.latency_model import (
    DecodeModel,
    DecodeSample,
    PrefillModel,
    PrefillSample,
    fit_decode,
    fit_prefill,
    mixed_step_s,
    nonnegative_lstsq,
)
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.profiles import BUILTIN, builtin_profile

TRUE_PREFILL = PrefillModel(a=2e-3, b=3e-5, c=4e-9)
TRUE_DECODE = DecodeModel(a=8e-3, b=5e-8, c=2e-5)
NOISE = 0.01  # relative, gaussian


def _noisy(value: float, rng: random.Random) -> float:
    return value * (1 + rng.gauss(0, NOISE))


def test_fit_recovers_prefill_coefficients_from_noisy_samples() -> None:
    rng = random.Random(0)
    samples = []
    for n in (64, 128, 256, 512, 1024, 2048, 4096):
        for batch in (1, 2, 4):
            lens = [n] * batch
            samples.append(PrefillSample(lens, _noisy(TRUE_PREFILL.step_s(sum(lens), sum(x * x for x in lens)), rng)))
    fitted, stats = fit_prefill(samples)
    assert fitted.a == pytest.approx(TRUE_PREFILL.a, rel=0.15)
    assert fitted.b == pytest.approx(TRUE_PREFILL.b, rel=0.03)
    assert fitted.c == pytest.approx(TRUE_PREFILL.c, rel=0.05)
    assert stats.r2 > 0.999 and stats.num_samples == len(samples)
    assert stats.max_rel_error < 5 * NOISE


def test_fit_recovers_decode_coefficients_from_noisy_samples() -> None:
    rng = random.Random(1)
    samples = [
        DecodeSample([ctx] * batch, _noisy(TRUE_DECODE.step_s(ctx * batch, batch), rng))
        for batch in (1, 8, 32, 64, 128, 256)
        for ctx in (128, 1024, 4096)
    ]
    fitted, stats = fit_decode(samples)
    assert fitted.a == pytest.approx(TRUE_DECODE.a, rel=0.03)
    assert fitted.b == pytest.approx(TRUE_DECODE.b, rel=0.05)
    assert fitted.c == pytest.approx(TRUE_DECODE.c, rel=0.15)
    assert stats.r2 > 0.99


def test_nonnegative_fit_clamps_a_coefficient_that_least_squares_would_make_negative() -> None:
    # y = 1 + 2x - 0.5 x^2 on x in [0, 2]: plain least squares gives c = -0.5 exactly
    x = np.linspace(0, 2, 21)
    features = np.stack([np.ones_like(x), x, x * x], axis=1)
    y = 1 + 2 * x - 0.5 * x * x
    unconstrained = np.linalg.lstsq(features, y, rcond=None)[0]
    assert unconstrained[2] == pytest.approx(-0.5)
    constrained = nonnegative_lstsq(features, y)
    assert np.all(constrained >= 0) and constrained[2] == 0
    # and it is the best among non-negative fits: no worse than the best two-term fit
    two_term = np.linalg.lstsq(features[:, :2], y, rcond=None)[0]
    assert np.sum((features @ constrained - y) ** 2) <= np.sum((features[:, :2] @ two_term - y) ** 2) + 1e-12


def test_fit_rejects_too_few_or_nonpositive_samples() -> None:
    with pytest.raises(ValueError, match="at least 3 samples"):
        fit_decode([DecodeSample([10], 0.01)])
    with pytest.raises(ValueError, match="finite and positive"):
        fit_decode([DecodeSample([10], 0.01), DecodeSample([20], 0.0), DecodeSample([30, 30], 0.02)])


def test_mixed_step_pays_both_variable_parts_and_the_larger_fixed_cost_once() -> None:
    p, d = TRUE_PREFILL, TRUE_DECODE
    mixed = mixed_step_s(p, d, 256, 256 * 256, 10_000, 16)
    assert mixed == pytest.approx(max(p.a, d.a) + p.b * 256 + p.c * 256 * 256 + d.b * 10_000 + d.c * 16)
    assert mixed_step_s(p, d, 256, 256 * 256, 0, 0) == pytest.approx(p.prompt_s(256))
    assert mixed_step_s(p, d, 0, 0, 10_000, 16) == pytest.approx(d.step_s(10_000, 16))
    assert mixed_step_s(p, d, 0, 0, 0, 0) == 0.0


def test_profile_round_trips_through_json_with_an_unlimited_link(tmp_path) -> None:
    original = builtin_profile("llama3-8b-h100").replace(
        link_gbps=math.inf,
        prefill_samples=[PrefillSample([128, 128], 0.01)],
        decode_samples=[DecodeSample([64] * 4, 0.008)],
    )
    path = tmp_path / "profile.json"
    original.save(path)
    assert b"Infinity" not in path.read_bytes()  # strict JSON: the unlimited link is null
    loaded = LatencyProfile.load(path)
    assert loaded == original


def test_a_profile_with_a_negative_coefficient_is_refused_naming_it() -> None:
    data = json.loads(builtin_profile("llama3-8b-h100").to_json())
    data["prefill"]["b"] = -1e-5
    with pytest.raises(ValueError, match=r"prefill\.b"):
        LatencyProfile.from_json(json.dumps(data))
    data["prefill"]["b"], data["max_num_seqs"] = 1e-5, 0
    with pytest.raises(ValueError, match="max_num_seqs"):
        LatencyProfile.from_json(json.dumps(data))


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_bytes_per_token_matches_the_engines_pool_layout(preset: str, dtype: str) -> None:
    config = PRESETS[preset]
    block_size = 16
    per_token = block_bytes(config, block_size, getattr(torch, dtype)) * config.num_layers // block_size
    assert kv_bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim, dtype) == per_token


def test_kv_sizing_of_published_models() -> None:
    assert kv_bytes_per_token(32, 8, 128, "bfloat16") == 128 * 1024  # Llama-3-8B: 128 KiB per token
    assert kv_bytes_per_token(80, 8, 128, "bfloat16") == 320 * 1024  # Llama-3-70B
    assert kv_capacity_tokens(80e9, 16e9, 4e9, 128 * 1024) == int(60e9 // (128 * 1024))
    with pytest.raises(ValueError, match="do not fit"):
        kv_capacity_tokens(80e9, 140e9, 4e9, 128 * 1024)


def test_builtin_profiles_are_finite_and_rank_like_their_hardware() -> None:
    profiles = {name: builtin_profile(name) for name in BUILTIN}
    for p in profiles.values():
        for m in (p.prefill, p.decode):
            assert all(math.isfinite(v) and v >= 0 for v in (m.a, m.b, m.c))
        assert p.kv_capacity_tokens > 10_000 and p.prefill.prompt_s(1024) > 0
    for name in ("llama3-8b-h100", "llama3-8b-h200", "llama3-70b-h100-tp4"):
        assert profiles[name].prefill_fit.r2 > 0.99 and profiles[name].decode_fit.r2 > 0.99
    h100, h200 = profiles["llama3-8b-h100"], profiles["llama3-8b-h200"]
    # same compute, 1.43x the bandwidth: decode (memory-bound) faster, prefill (compute-bound) alike
    assert h200.decode.step_s(64 * 1024, 64) < 0.85 * h100.decode.step_s(64 * 1024, 64)
    assert h200.prefill.prompt_s(2048) == pytest.approx(h100.prefill.prompt_s(2048), rel=0.05)
    assert h200.kv_capacity_tokens > 1.8 * h100.kv_capacity_tokens  # 141 GB against 80 GB
    assert profiles["llama3-70b-h100-tp4"].prefill.prompt_s(2048) > 2 * h100.prefill.prompt_s(2048)
    with pytest.raises(ValueError, match="unknown"):
        builtin_profile("gpt-5-on-a-toaster")
