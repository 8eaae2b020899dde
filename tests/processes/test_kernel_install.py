"""The install builds minipd's CPU kernels (setup.py, models/kernels/kernel_build.py), for a first
start that compiles nothing: `pip install .` of a copy of this checkout (into a --target, without
build isolation or dependencies) puts the variant's library in the installed package, and a
first start with an empty kernel cache and no compiler on its PATH loads it; an editable
build puts the libraries in the source tree; an install with no compiler succeeds, with no
library (the first use builds them then: tests/unit/models/test_kernel_prebuilt.py).

A process test: pip runs and one variant is compiled with g++ (tens of seconds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minipd.models.kernels import kernel_build
from minipd.models.kernels.cpu_flags import read_cpu_flags
from minipd.models.kernels.kernel_build import PREBUILT_ENV, VARIANTS

ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_S = 600
FLAGS = read_cpu_flags() or frozenset()
RUNS_HERE = [v for v, needs in VARIANTS.items() if set(needs.cpu_flags) <= FLAGS]
pytestmark = pytest.mark.skipif(kernel_build.builds_here() is not None, reason=str(kernel_build.builds_here()))
FIRST_START = """
import torch
from minipd.models.kernels import vnni_kernels
packed = vnni_kernels.pack_q8(torch.ones(16, 32, dtype=torch.int8), torch.ones(16, 1).half())
print(vnni_kernels.__file__, float(vnni_kernels.q8_mm(torch.ones(1, 32), packed, 32, vnni_kernels.best())[0, 0]))
"""


def _checkout(tmp_path: Path) -> Path:
    """What `pip install .` reads of this checkout, copied (pip builds in the source tree)."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "prebuilt", "*.egg-info", "build")
    for name in ("minipd", "models", "transports"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    return source


def _pip_install(source: Path, target: Path, **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "install", "-v", "--no-deps", "--no-build-isolation", "--target"]
    environment = {k: v for k, v in os.environ.items() if k not in ("CXX", "MINIPD_PREBUILD_KERNELS")}
    environment.update(PIP_DISABLE_PIP_VERSION_CHECK="1", **env)
    return subprocess.run(
        [*command, str(target), str(source)], env=environment, capture_output=True, text=True, timeout=PIP_TIMEOUT_S
    )


def _no_compiler_path(tmp_path: Path) -> str:
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    return str(empty)


@pytest.mark.skipif(not RUNS_HERE, reason="no variant of minipd's kernels runs on this CPU")
def test_pip_install_prebuilds_the_kernels_and_the_first_start_loads_them(tmp_path: Path) -> None:
    variant, target = RUNS_HERE[0], tmp_path / "site"
    done = _pip_install(_checkout(tmp_path), target, MINIPD_PREBUILD_KERNELS=variant)
    assert done.returncode == 0, done.stderr[-3000:]
    libraries = list((target / "minipd" / "models" / "kernels" / "prebuilt").iterdir())
    assert [p.name for p in libraries] == [f"{variant}_kernels-{kernel_build.prebuilt_key(variant)}.so"]
    env = {**os.environ, "PYTHONPATH": str(target), "MINIPD_KERNEL_CACHE": str(tmp_path / "cache")}
    env.update(PATH=_no_compiler_path(tmp_path))  # no g++: whatever loads was prebuilt
    for name in (PREBUILT_ENV, "CXX"):
        env.pop(name, None)
    first = subprocess.run(  # not from this checkout, whose minipd/ `-c` would find first
        [sys.executable, "-c", FIRST_START], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr[-3000:]
    module, answer = first.stdout.split()
    assert Path(module).is_relative_to(target) and float(answer) == 32.0  # the installed package, its library
    assert not (tmp_path / "cache").exists() and "building" not in first.stderr


def test_an_editable_build_puts_the_libraries_in_the_source_tree(tmp_path: Path) -> None:
    """The build pip runs for `pip install -e .` (PEP 660's hook), with a stand-in compiler."""
    source = _checkout(tmp_path)
    fake = tmp_path / "bin" / "c++"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nwhile [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done\necho x > "$out"\n')
    fake.chmod(0o755)
    (source / "dist").mkdir()
    build = "from setuptools import build_meta; print(build_meta.build_editable('dist'))"
    env = {**os.environ, "CXX": str(fake), "MINIPD_PREBUILD_KERNELS": "all"}
    done = subprocess.run(
        [sys.executable, "-c", build], cwd=source, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = sorted(p.name for p in (source / "models" / "kernels" / "prebuilt").iterdir())
    assert built == sorted(f"{v}_kernels-{kernel_build.prebuilt_key(v)}.so" for v in VARIANTS)


def test_pip_install_without_a_compiler_succeeds_with_no_library(tmp_path: Path) -> None:
    target = tmp_path / "site"
    done = _pip_install(_checkout(tmp_path), target, PATH=_no_compiler_path(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (target / "minipd" / "models" / "kernels" / "vnni_kernels.py").is_file()
    assert not list((target / "minipd" / "models" / "kernels").glob("prebuilt/*.so"))
    assert "not prebuilt (no C++ compiler" in done.stdout + done.stderr
