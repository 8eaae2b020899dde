"""The package's layers hold: no module imports from a layer above its own (docs/architecture.md
lists them; `models/` is layered too, by sub-package), no core module imports an operation
(minipd/ops/: the two rooms), no modules import each other, directly or in a ring (every
import statement counts: at module level, inside functions, and under `if TYPE_CHECKING:`),
and no module runs past the length limit without saying why at its top."""

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
#
# The layers fall in two rooms (docs/architecture.md, "The two rooms"): the CORE, what one
# request needs, and OPERATIONS (minipd/ops/*), what watches or steers it. No core layer may
# import an operation: an operation plugs in from outside, wired by the command line
# (`entrypoints`), which with `minipd` itself may import both.
CORE_LAYERS = {
    *("api", "router", "disagg", "control", "engine", "policy", "slo", "tracing", "models", "transports", "kvtier"),
}
OPS_LAYERS = {
    "ops",  # minipd/ops/__init__.py
    "ops.control_loop",
    "ops.admin",
    "ops.registry",
    "ops.dashboard",
    "ops.planner",
    "ops.loadgen",
    "ops.workload",
}
TOP_LAYERS = {"entrypoints", "minipd"}
EVERY_LAYER = CORE_LAYERS | OPS_LAYERS | TOP_LAYERS
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
    # the core, bottom up
    **MODELS_LAYERS,
    "models": {"models", *MODELS_LAYERS},  # models/__init__.py
    "transports": {"transports"},
    "kvtier": {"kvtier"},  # the shared KV tier: bytes, buffers and keys; a fingerprint only as its digest
    "slo": {"slo"},
    "policy": {"policy", "slo"},
    "engine": {"engine", "models"},
    "tracing": {"tracing", "engine", "models"},
    "control": {"control", "engine", "models", "transports", "tracing"},
    "disagg": {"disagg", "control", "engine", "models", "transports", "tracing", "kvtier"},
    "router": {"router", "control", "engine", "models", "policy", "slo", "tracing"},
    "api": {"api", "router", "control", "engine", "policy", "slo", "models", "tracing"},
    # operations, bottom up: each may import the core and the operations it names
    "ops": {"ops"},
    "ops.workload": {"ops.workload"},
    "ops.loadgen": {"ops.loadgen", "ops.workload", "slo", "engine"},  # engine: the built-in load's InvalidRequestError
    "ops.planner": {"ops.planner", "ops.workload", "policy", "slo", "engine", "models"},
    # the live controller, pool scaler, cluster mode, link caps: they steer the router from outside it
    "ops.control_loop": {"ops.control_loop", "router", "control", "engine", "models", "policy", "slo"},
    "ops.admin": {
        *("ops.admin", "ops.control_loop", "ops.loadgen", "ops.workload"),
        *("api", "router", "control", "engine", "policy", "slo", "models", "tracing"),
    },
    # membership in etcd: drives a router's links and publishes an instance
    "ops.registry": {
        *("ops.registry", "ops.control_loop"),
        *("router", "disagg", "control", "engine", "models", "transports", "policy", "slo"),
    },
    "ops.dashboard": {"ops.dashboard", "ops.workload", "api", "router", "control", "engine", "policy", "slo", "models"},
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
    if parts[1] == "ops":
        return f"ops.{parts[2]}" if len(parts) > 3 else "ops"
    return parts[1] if len(parts) > 2 else "minipd"


def _layer_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "minipd":
        return None
    if parts[1:2] == ["models"]:
        return f"models.{parts[2]}" if len(parts) > 2 and f"models.{parts[2]}" in ALLOWED else "models"
    if parts[1:2] == ["ops"]:
        return f"ops.{parts[2]}" if len(parts) > 2 and f"ops.{parts[2]}" in ALLOWED else "ops"
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


def _packages(folder: Path, prefix: str = "") -> set[str]:
    return {f"{prefix}{p.name}" for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_the_layer_table_knows_every_package():
    packages = _packages(ROOT / "minipd") | _packages(ROOT / "minipd/ops", "ops.")
    assert packages <= set(ALLOWED), f"add {packages - set(ALLOWED)} to ALLOWED and to docs/architecture.md"


def test_every_layer_is_in_one_room():
    layers = set(ALLOWED) - set(MODELS_LAYERS)
    assert not (CORE_LAYERS & OPS_LAYERS) and not (TOP_LAYERS & (CORE_LAYERS | OPS_LAYERS))
    assert layers == EVERY_LAYER, f"put {sorted(layers ^ EVERY_LAYER)} in CORE_LAYERS, OPS_LAYERS or TOP_LAYERS"
    assert all(layer == "ops" or layer.startswith("ops.") for layer in OPS_LAYERS)  # operations live in minipd/ops/


def test_no_core_layer_may_import_an_operation():
    for layer in [*CORE_LAYERS, *MODELS_LAYERS]:
        assert not (ALLOWED[layer] & OPS_LAYERS), f"core layer {layer} may import {sorted(ALLOWED[layer] & OPS_LAYERS)}"


def _is_core(path: Path) -> bool:
    layer = _layer_of_file(path)
    return layer in CORE_LAYERS or layer in MODELS_LAYERS


def _operations_imported(path: Path) -> list[str]:
    return [
        f"line {line}: {module}"
        for line, module in _imported_modules(path)
        if module.split(".")[:2] == ["minipd", "ops"]
    ]


@pytest.mark.parametrize("path", [p for p in _source_files() if _is_core(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_core_module_imports_an_operation(path: Path):
    """Every import statement of a core module (at module level, in functions, under
    TYPE_CHECKING) counts, whatever the table above says."""
    bad = _operations_imported(path)
    assert not bad, "the core imports no operation; plug it in from outside (minipd/entrypoints): " + "; ".join(bad)


def test_the_room_check_sees_every_kind_of_import(tmp_path):
    module = tmp_path / "router_like.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "import minipd.router.registry\n"
        "if TYPE_CHECKING:\n"
        "    from minipd.ops.control_loop.live_controller import LiveRatioController\n"
        "def plan():\n"
        "    import minipd.ops.planner.simulator\n"
    )
    assert _operations_imported(module) == [
        "line 4: minipd.ops.control_loop.live_controller",
        "line 6: minipd.ops.planner.simulator",
    ]
    assert _layer_of_file(ROOT / "minipd/ops/planner/simulator.py") == "ops.planner"
    assert _layer_of_file(ROOT / "minipd/ops/__init__.py") == "ops"
    assert _layer_of_module("minipd.ops.dashboard.routes") == "ops.dashboard"
    assert _is_core(ROOT / "minipd/router/router.py") and _is_core(ROOT / "transports/base.py")
    assert not _is_core(ROOT / "minipd/ops/control_loop/live_controller.py")
    assert not _may_import("router", "ops.control_loop") and _may_import("entrypoints", "ops.registry")


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
    assert "minipd.ops.planner.__main__" in graph["minipd.entrypoints.cli"]  # inside a function
    assert "minipd.router.router" in graph["minipd.ops.control_loop.live_controller"]  # under TYPE_CHECKING
    assert "minipd.transports.fault_points" in graph["minipd.transports.request_calls"]  # `from package import module`
    assert "minipd.models.kernels.vnni_kernels" in graph["minipd.models.weights.quantized_linear"]  # a sub-package


def test_the_layer_check_sees_models_subpackages():
    assert _layer_of_file(ROOT / "models/gguf/gguf_loader.py") == "models.gguf"
    assert _layer_of_module("minipd.models.arch.llama") == "models.arch"
    assert not _may_import("models.weights", "models.arch")  # below it
    assert _may_import("engine", "models.kernel_steps")  # "models" in ALLOWED: any of its sub-packages


def test_no_import_cycles():
    cycles = _cycles(_import_graph())
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)
