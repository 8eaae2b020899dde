"""docs/architecture.md's hops of a request (`file.py:Class.method` or `file.py:function`) name
code that exists: the page a newcomer follows must not point at a function that moved."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
HOP = re.compile(r"\b([a-z_]+(?:/[a-z_]+)*\.py):([A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)?)")
PACKAGE_FOLDERS = ("minipd", "models", "transports")


def _source(relative: str) -> Path | None:
    """The one package file whose path ends with `relative` ("router/attempt.py", or "attempt.py"
    in a sentence about the router); None where there is none or several."""
    matches = [
        p
        for folder in PACKAGE_FOLDERS
        for p in (ROOT / folder).rglob(Path(relative).name)
        if p.as_posix().endswith("/" + relative)
    ]
    return matches[0] if len(matches) == 1 else None


def _names(path: Path) -> set[str]:
    """Top-level functions and classes, and Class.method for each method."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(f"{node.name}.{item.name}")
    return names


def test_the_page_names_hops():
    assert len(HOP.findall(PAGE.read_text())) >= 10


def test_every_hop_names_a_file_and_a_function_that_exist():
    missing = []
    for relative, name in HOP.findall(PAGE.read_text()):
        if "<" in relative:
            continue
        path = _source(relative)
        if path is None:
            missing.append(f"{relative}: no such file, or several")
        elif name not in _names(path):
            missing.append(f"{relative}:{name}: no such function or method")
    assert not missing, missing
