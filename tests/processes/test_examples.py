"""The examples docs/api.md shows are real files, shown there verbatim, and they run."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "embed_engine.py"
CLUSTER_EXAMPLE = ROOT / "examples" / "inprocess_cluster.py"


@pytest.mark.parametrize("example", [EXAMPLE, CLUSTER_EXAMPLE], ids=lambda p: p.name)
def test_docs_show_the_example_verbatim(example):
    body = example.read_text().split('"""', 2)[2].strip()  # without the module docstring
    assert body in (ROOT / "docs" / "api.md").read_text()


def test_embedding_example_runs_and_frees_every_block():
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert "num_running=0" in last and "num_used=0" in last


def test_inprocess_cluster_example_disaggregates_and_frees_every_block():
    proc = subprocess.run([sys.executable, str(CLUSTER_EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "KV prefill-0 -> decode-0" in lines[0] and lines[0].startswith("8 tokens")
    assert lines[1:] == ["prefill-0 0 blocks in use", "decode-0 0 blocks in use"]
