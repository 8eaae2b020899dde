"""No module of the package (minipd/, models/, transports/) is over 400 lines unless its
docstring says why, in a sentence beginning "Longer than 400 lines because": a newcomer reads
a module in one sitting, and a long one says what keeps it whole."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("minipd", "models", "transports")
MAX_LINES = 400
REASON = "Longer than 400 lines because"


def _modules() -> list[Path]:
    return sorted(p for folder in PACKAGE_FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_the_package_has_modules_to_check():
    assert len(_modules()) > 100


def test_every_module_over_400_lines_says_why():
    unexplained = []
    for path in _modules():
        source = path.read_text()
        if source.count("\n") <= MAX_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(source)) or ""
        if REASON not in " ".join(docstring.split()):
            unexplained.append(f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines")
    assert not unexplained, f"over {MAX_LINES} lines with no '{REASON}' in the docstring: {unexplained}"
