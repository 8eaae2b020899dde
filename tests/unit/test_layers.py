"""The package's layers hold: no module imports from a layer above its own (docs/architecture.md
lists them; `models/` is layered too, by sub-package), no modules import each other, directly or
in a ring (every import statement counts: at module level, inside functions, and under
`if TYPE_CHECKING:`), and no module runs past the length limit without saying why at its top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400  # in ruff format's layout, which spreads a long call over a line per argument
LENGTH_REASON = "Longer than 400 lines because"  # a module past MAX_LINES says why in its docstring, in this sentence

# Each layer and the layers it may import (itself included). Everything may import the
# standard library and third-party packages; `minipd` itself is the public surface and counts
# as the top layer.
EVERY_LAYER = {
    "minipd",
    "entrypoints",
    "api",
    "registry",
    "dashboard",
    "router",
    "disagg",
    "control",
    "engine",
    "planner",
    "policy",
    "workload",
    "loadgen",
    "slo",
    "models",
    "transports",
    "tracing",
}
# The sub-packages of models/, bottom up, each with the ones it may import; a layer above models
# that may import "models" may import any of them.
MODELS_LAYERS: dict[str, set[str]] = {
    "models.kernels": {"models.kernels"},
    "models.weights": {"models.weights", "models.kernels"},
    "models.arch": {"models.arch", "models.weights", "models.kernels"},
    "models.kernel_steps": {"models.kernel_steps", "models.arch", "models.weights", "models.kernels"},
    "models.gguf": {"models.gguf", "models.arch", "models.weights", "models.kernels"},
    "models.tokenizers": {"models.tokenizers", "models.gguf", "models.arch"},
    "models.checkpoints": {"models.checkpoints", "models.arch"},
}
ALLOWED: dict[str, set[str]] = {
    **MODELS_LAYERS,
    "models": {"models", *MODELS_LAYERS},  # models/__init__.py
    "transports": {"transports"},
    "slo": {"slo"},
    "workload": {"workload"},
    "loadgen": {"loadgen", "slo", "workload"},
    "policy": {"policy", "slo", "workload"},
    "engine": {"engine", "models"},
    "tracing": {"tracing", "engine", "models"},
    "planner": {"planner", "policy", "slo", "workload", "engine", "models"},
    "control": {"control", "engine", "models", "transports", "tracing"},
    "disagg": {"disagg", "control", "engine", "models", "transports", "tracing"},
    "router": {"router", "control", "engine", "models", "policy", "slo", "tracing"},
    "api": {"api", "router", "control", "engine", "policy", "slo", "models", "loadgen", "workload", "tracing"},
    # membership in etcd: drives a router's links and publishes an instance
    "registry": {"registry", "router", "disagg", "control", "engine", "models", "transports", "policy", "slo"},
    "dashboard": {"dashboard", "api", "router", "control", "engine", "policy", "slo", "models", "workload"},
    # the top: the command line and the package's own exports may import every layer
    "entrypoints": EVERY_LAYER,
    "minipd": EVERY_LAYER,
}


def _layer_of_file(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    if parts[0] == "models":
        return f"models.{parts[1]}" if len(parts) > 2 else "models"
    if parts[0] == "transports":
        return parts[0]
    return parts[1] if len(parts) > 2 else "minipd"


def _layer_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "minipd":
        return None
    if parts[1:2] == ["models"]:
        return f"models.{parts[2]}" if len(parts) > 2 and f"models.{parts[2]}" in ALLOWED else "models"
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else "minipd"


def _may_import(layer: str, target: str) -> bool:
    allowed = ALLOWED[layer]
    return target in allowed or (target.startswith("models.") and "models" in allowed and layer != "models")


def _source_files() -> list[Path]:
    files = [
        *ROOT.joinpath("minipd").rglob("*.py"),
        *ROOT.joinpath("models").rglob("*.py"),
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


def test_the_layer_table_knows_every_models_subpackage():
    folders = {p for p in ROOT.joinpath("models").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert all((p / "__init__.py").exists() for p in folders), "every folder in models/ is a package"
    packages = {f"models.{p.name}" for p in folders}
    assert packages == set(MODELS_LAYERS), (
        f"MODELS_LAYERS and models/ differ: {sorted(packages ^ set(MODELS_LAYERS))}; and docs/architecture.md"
    )


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_from_a_layer_above(path: Path):
    layer = _layer_of_file(path)
    bad = [
        f"line {line}: {module}"
        for line, module in _imported_modules(path)
        if (target := _layer_of_module(module)) is not None and not _may_import(layer, target)
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "minipd":  # models/ and transports/ install as minipd.models, minipd.transports
        parts.insert(0, "minipd")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports: every import statement, at module level, in
    functions, and under `if TYPE_CHECKING:` alike (a ring of type-only imports still ties the
    modules together). `from package import name` counts as importing `package.name` when that
    is a module, else `package`; a package's own `__init__` running first is not counted."""
    modules = {_module_name(p): p for p in _source_files()}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets.update(
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                )
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_names_a_ring():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [("a", "b", "c")]


def test_the_import_graph_sees_imports_in_functions_and_type_checking_blocks():
    graph = _import_graph()
    assert "minipd.planner.__main__" in graph["minipd.entrypoints.cli"]  # inside a function
    assert "minipd.router.router" in graph["minipd.router.live_controller"]  # under TYPE_CHECKING
    assert "minipd.transports.fault_points" in graph["minipd.transports.base"]  # `from package import module`
    assert "minipd.models.kernels.vnni_kernels" in graph["minipd.models.weights.quantized_linear"]  # a sub-package


def test_the_layer_check_sees_models_subpackages():
    assert _layer_of_file(ROOT / "models/gguf/gguf_loader.py") == "models.gguf"
    assert _layer_of_module("minipd.models.arch.llama") == "models.arch"
    assert not _may_import("models.weights", "models.arch")  # below it
    assert _may_import("engine", "models.kernel_steps")  # "models" in ALLOWED: any of its sub-packages


def test_no_import_cycles():
    cycles = _cycles(_import_graph())
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)
