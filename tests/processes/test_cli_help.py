"""`minipd --help` and per-role help explain every flag."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minipd", *args], capture_output=True, text=True, timeout=60)


def test_top_level_help_lists_roles():
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "--role" in proc.stdout and "both" in proc.stdout and "colocated" in proc.stdout


ROLE_FLAGS = {
    "both": {"--model", "--device", "--num-blocks", "--max-num-batched-tokens", "--prompt", "--seed", "--port"},
    "prefill": {"--model", "--port", "--transport", "--link-gbps", "--router"},
    "decode": {"--model", "--port", "--transport", "--lease-s"},
    "router": {
        "--model",
        "--port",
        "--prefill",
        "--decode",
        "--local-prefill-max-tokens",
        "--no-layerwise",
        "--http-port",
    },
    "cluster": {
        "--num-prefill",
        "--num-decode",
        "--transport",
        "--http-port",
        "--prompt",
        "--link-gbps",
        "--max-restarts",
        "--exit-on-child-failure",
    },
}


@pytest.mark.parametrize("role", sorted(ROLE_FLAGS))
def test_every_flag_of_every_role_has_help_text(role):
    proc = run_cli("--role", role, "--help")
    assert proc.returncode == 0
    options = proc.stdout.split("options:", 1)[1]
    flags = set(re.findall(r"^\s+(--[a-z][a-z-]*)", options, flags=re.M))
    assert ROLE_FLAGS[role] <= flags
    for flag in flags:
        # each flag line is followed (same or next line) by a description
        match = re.search(rf"^\s+{re.escape(flag)}\b[^\n]*(\n\s{{10,}}\S[^\n]*)?", options, flags=re.M)
        assert match and len(match.group(0).split()) > 2, f"{flag} has no help text"


def test_unknown_role_is_refused():
    proc = run_cli("--role", "nonsense")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
