"""Building minipd's CPU kernels with g++ at first use (models/kernels/vnni_kernels.py), where no
prebuilt library is found: the build is cached, once, for processes that start together, saying
so in one warning, and reused after; a variant this CPU cannot run still compiles, so an edit
made on one CPU family cannot break the other's build. A process test: each build is a g++ run of
tens of seconds. The install-time build is tests/processes/test_kernel_install.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minipd.models.kernels import kernel_build, vnni_kernels
from minipd.models.kernels.kernel_build import PREBUILT_ENV

RUNNABLE = [v for v in vnni_kernels.VARIANTS if vnni_kernels.unavailable(v) is None]


_BUILD = """
import os, sys, time, torch
from minipd.models.kernels import vnni_kernels
variant = vnni_kernels.best()
assert variant is not None
x = torch.ones(1, 32, dtype=torch.bfloat16)
packed = vnni_kernels.pack_q8(torch.ones(16, 32, dtype=torch.int8), torch.ones(16, 1).half())
print(float(vnni_kernels.q8_mm(x, packed, 32, variant)[0, 0]), [p.name for p in vnni_kernels.cache_dir().glob("*.so")])
"""


@pytest.mark.skipif(not RUNNABLE, reason="no variant of minipd's int8 kernels runs on this CPU")
def test_the_build_is_cached_once_for_processes_that_start_together(tmp_path: Path) -> None:
    (tmp_path / "no-prebuilt").mkdir()
    env = {**os.environ, "MINIPD_KERNEL_CACHE": str(tmp_path / "cache"), PREBUILT_ENV: str(tmp_path / "no-prebuilt")}
    run = lambda: subprocess.Popen(  # noqa: E731
        [sys.executable, "-c", _BUILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first, second = run(), run()
    outputs = [p.communicate(timeout=kernel_build.BUILD_TIMEOUT_S) for p in (first, second)]
    assert first.returncode == second.returncode == 0, outputs
    libraries = sorted((tmp_path / "cache").glob("*.so"))
    assert len(libraries) == 1 and all(out.strip().startswith("32.0") for out, _ in outputs)
    assert sum(err.count("building minipd's") for _, err in outputs) == 1  # the one build says so, once
    built = libraries[0].stat().st_mtime_ns
    out, err = (again := run()).communicate(timeout=120)
    assert out.startswith("32.0") and again.returncode == 0 and "building" not in err
    assert libraries[0].stat().st_mtime_ns == built  # loaded, not rebuilt
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]  # no build directory left behind


@pytest.mark.parametrize("variant", [v for v in vnni_kernels.VARIANTS if v not in RUNNABLE] or [None])
def test_a_variant_this_cpu_cannot_run_still_compiles(variant, tmp_path: Path) -> None:
    """Edits made on a machine without a variant's instructions must not break its build there."""
    if variant is None:
        pytest.skip("every variant runs on this CPU (and the tests above built each)")
    compiler = kernel_build.find_compiler()
    assert compiler is not None, "no C++ compiler"
    kernel_build.compile_library(compiler, tmp_path / f"{variant}.so", variant)  # RuntimeError with g++'s words
    assert (tmp_path / f"{variant}.so").stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == [f"{variant}.so"]  # no object file left behind
