"""The engine's step log (`--step-log-dir`) and the planner's fit of it: each line is one whole
step with the batch it ran, steps of a busy engine do not overlap, the fit recovers known
coefficients, the CLI names the file after the instance, and a line that is not a step is
refused by file and line."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from engine_helpers import complete_all

from minipd.engine.sampling_params import SamplingParams
from minipd.ops.planner import step_log_fit
from minipd.ops.planner.latency_model import DecodeModel, PrefillModel

PROMPT_LENS = (20, 33)
MAX_TOKENS = 6


def test_each_step_of_the_engine_is_one_line_with_its_batch(make_engine, loop_thread, tmp_path):
    path = tmp_path / "steps" / "engine.jsonl"
    engine = make_engine(model="tiny", dtype="float32", num_blocks=64, max_model_len=128, step_log=str(path))
    prompts = [[(7 * i + j) % 200 + 3 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    loop_thread.run(complete_all(engine, prompts, params))
    steps = step_log_fit.read_steps(path)
    assert len(steps) == engine.num_steps
    prefilled = sorted(q for s in steps for q in s.q)
    assert prefilled == sorted(PROMPT_LENS)  # each prompt in one chunk (within the budget), q == k
    assert all(q == k for s in steps for q, k in zip(s.q, s.k))
    decodes = sorted(c for s in steps for c in s.ctx)
    # every output token after the first is one decode, at contexts prompt+1 .. prompt+MAX_TOKENS-1
    assert decodes == sorted(n + i for n in PROMPT_LENS for i in range(1, MAX_TOKENS))
    assert all(s.seconds > 0 for s in steps)
    for a, b in zip(steps, steps[1:]):
        assert b.start_s >= a.start_s + a.seconds - 1e-6  # one step at a time


def _write(path, steps):
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))


def test_the_fit_recovers_the_step_models_of_pure_steps_and_ignores_mixed_ones(tmp_path):
    prefill, decode = PrefillModel(0.02, 3e-4, 2e-7), DecodeModel(0.012, 4e-6, 6e-4)
    rng = random.Random(1)
    lines = []
    for i in range(40):
        q = [rng.randrange(16, 400) for _ in range(rng.randrange(1, 3))]
        k = [n + rng.choice((0, 16, 64)) for n in q]
        seconds = prefill.step_s(sum(q), sum(a * b for a, b in zip(q, k)))
        lines.append({"t": i, "s": seconds, "q": q, "k": k, "ctx": []})
    for i in range(40):
        ctx = [rng.randrange(20, 600) for _ in range(rng.randrange(1, 12))]
        lines.append({"t": 100 + i, "s": decode.step_s(sum(ctx), len(ctx)), "q": [], "k": [], "ctx": ctx})
    lines.append({"t": 200, "s": 9.0, "q": [100], "k": [100], "ctx": [50]})  # mixed: in neither fit
    _write(tmp_path / "steps.jsonl", lines)
    steps = step_log_fit.read_steps(tmp_path / "steps.jsonl")
    got_p, fit_p = step_log_fit.fit_prefill_steps(steps)
    got_d, fit_d = step_log_fit.fit_decode_steps(steps)
    for got, want in ((got_p, prefill), (got_d, decode)):
        for coef in "abc":
            assert getattr(got, coef) == pytest.approx(getattr(want, coef), rel=1e-6)
    assert fit_p.num_samples == 40 and fit_d.num_samples == 40 and fit_d.r2 > 0.999999
    assert len(step_log_fit.read_steps(tmp_path / "steps.jsonl", since_s=100)) == 41


def test_a_line_that_is_not_a_step_is_refused_by_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t": 0, "s": 0.1, "q": [], "k": [], "ctx": [3]}\n{"t": 1, "s": 0.1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a step"):
        step_log_fit.read_steps(path)


def test_the_cli_names_each_instances_log_after_it(tmp_path):
    # `--role both` with a prompt runs one demo and exits: its log is DIR/INSTANCE-ID.jsonl.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "minipd",
            "--role",
            "both",
            "--model",
            "tiny",
            "--max-tokens",
            "4",
            "--prompt",
            "hello",
            "--instance-id",
            "demo-7",
            "--step-log-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    steps = step_log_fit.read_steps(tmp_path / "demo-7.jsonl")
    assert steps and any(s.q for s in steps) and any(s.ctx for s in steps)
