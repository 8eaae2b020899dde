"""The README's embedding example is a real file, shown verbatim in the README, and it runs."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "embed_engine.py"


def test_readme_shows_the_example_verbatim():
    body = EXAMPLE.read_text().split('"""', 2)[2].strip()  # without the module docstring
    assert body in (ROOT / "README.md").read_text()


def test_embedding_example_runs_and_frees_every_block():
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert "num_running=0" in last and "num_used=0" in last
