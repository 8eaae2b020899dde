"""The package's layers hold: no module imports from a layer above its own (docs/architecture.md
lists them), and no module runs past the length limit without saying why at its top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 350  # in ruff format's layout, which spreads a long call over a line per argument
LENGTH_REASON = "Length:"  # a module past MAX_LINES says why in its docstring, after this word

# Each layer and the layers it may import (itself included). Everything may import the
# standard library and third-party packages; `minipd` itself is the public surface and counts
# as the top layer.
EVERY_LAYER = {
    "minipd",
    "entrypoints",
    "api",
    "router",
    "disagg",
    "control",
    "engine",
    "planner",
    "policy",
    "workload",
    "slo",
    "models",
    "transports",
}
ALLOWED: dict[str, set[str]] = {
    "models": {"models"},
    "transports": {"transports"},
    "slo": {"slo"},
    "workload": {"workload"},
    "policy": {"policy", "slo", "workload"},
    "engine": {"engine", "models"},
    "planner": {"planner", "policy", "slo", "workload", "engine", "models"},
    "control": {"control", "engine", "models", "transports"},
    "disagg": {"disagg", "control", "engine", "models", "transports"},
    "router": {"router", "control", "engine", "models", "policy", "slo"},
    "api": {"api", "router", "control", "engine", "policy", "slo", "models"},
    # the top: the command line and the package's own exports may import every layer
    "entrypoints": EVERY_LAYER,
    "minipd": EVERY_LAYER,
}


def _layer_of_file(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    if parts[0] in ("models", "transports"):
        return parts[0]
    return parts[1] if len(parts) > 2 else "minipd"


def _layer_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "minipd":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else "minipd"


def _source_files() -> list[Path]:
    files = [
        *ROOT.joinpath("minipd").rglob("*.py"),
        *ROOT.joinpath("models").glob("*.py"),
        *ROOT.joinpath("transports").glob("*.py"),
    ]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                package = ".".join(("minipd", *path.relative_to(ROOT).parts[:-1]))
                package = package.replace("minipd.minipd", "minipd")
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.append((node.lineno, f"{base}.{node.module}" if node.module else base))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def test_the_layer_table_knows_every_package():
    packages = {p.name for p in ROOT.joinpath("minipd").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(ALLOWED), f"add {packages - set(ALLOWED)} to ALLOWED and to docs/architecture.md"


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_from_a_layer_above(path: Path):
    layer = _layer_of_file(path)
    bad = [
        f"line {line}: {module}"
        for line, module in _imported_modules(path)
        if (target := _layer_of_module(module)) is not None and target not in ALLOWED[layer]
    ]
    assert not bad, f"{layer} may import only {sorted(ALLOWED[layer])}: " + "; ".join(bad)


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_long_modules_say_why(path: Path):
    source = path.read_text()
    num_lines = source.count("\n")
    if num_lines <= MAX_LINES:
        return
    docstring = ast.get_docstring(ast.parse(source)) or ""
    assert LENGTH_REASON in docstring, f"{num_lines} lines: split it, or say why at its top ({LENGTH_REASON} ...)"
