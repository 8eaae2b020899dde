"""docs/configuration.md is generated from the flag tables, and is up to date with them."""

from __future__ import annotations

import pathlib

from minipd.entrypoints import config_reference
from minipd.entrypoints.flags import FLAGS

ROOT = pathlib.Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "docs" / "configuration.md"


def test_configuration_reference_is_up_to_date():
    assert REFERENCE.read_text() == config_reference.render(), (
        "docs/configuration.md is out of date: python -m minipd.entrypoints.config_reference > docs/configuration.md"
    )


def test_every_flag_has_a_row_and_every_section_a_heading():
    text = config_reference.render()
    for flag in FLAGS:
        assert f"| `{flag.name}" in text, flag.name
        assert f"## {flag.group}\n" in text, flag.group


def test_help_defaults_are_filled_in_and_pipes_escaped():
    text = config_reference.render()
    assert "%(default)" not in text
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    assert len(rows) == len(FLAGS)
    assert all(line.replace("\\|", "").count("|") == 7 for line in rows)  # six cells, no stray pipe


def test_reference_does_not_read_the_environment(monkeypatch):
    monkeypatch.setenv("MINIPD_API_KEY", "a-key-that-must-not-appear")
    assert "a-key-that-must-not-appear" not in config_reference.render()
