"""minipd's install step beyond pyproject.toml: after setuptools' build_py, minipd's CPU kernels are
built with g++ into the package (`minipd/models/kernels/prebuilt/`), so that the first start
loads them instead of compiling them (models/kernels/kernel_build.py, docs/models.md).

Contracts:
- The kernels never fail the install: without g++ or torch, on a compiler error or a platform
  they do not run on, the install goes on with a line saying why, and the first use builds
  them into the cache as before.
- `pip install .` puts the libraries in the wheel's package; `pip install -e .` (setuptools runs
  build_py in editable mode too, copying nothing) builds them in place, in the source tree's
  `models/kernels/prebuilt/` (ignored by git), where the editable package's files are.
- MINIPD_PREBUILD_KERNELS picks the variants: unset or `all` every one (the build machine's CPU
  need not run a variant to compile it), a comma list some, `0` or `none` none.
- The build runs in a fresh `python -I` of the interpreter being installed into: pip's build
  isolation hides that interpreter's packages (torch among them) from this process only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNELS = "minipd.models.kernels"
BUILD_TIMEOUT_S = 1800  # every variant, on one core


class BuildPyAndKernels(build_py):
    """build_py, then the CPU kernels prebuilt into the package (see the module's docstring)."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.kernel_libraries: list[str] = []

    def run(self) -> None:
        super().run()
        choice = os.environ.get("MINIPD_PREBUILD_KERNELS", "all").strip()
        if choice.lower() in ("0", "none", ""):
            print("minipd kernels: not prebuilt (MINIPD_PREBUILD_KERNELS)", file=sys.stderr)
            return
        source = Path(self.get_package_dir(KERNELS)).resolve()
        package = source if self.editable_mode else Path(self.build_lib, *KERNELS.split("."))
        variants = [] if choice.lower() == "all" else [v.strip() for v in choice.split(",")]
        command = [sys.executable, "-I", str(source / "kernel_build.py"), str(package / "prebuilt"), *variants]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            words = (done.stdout + done.stderr[-2000:]).strip()
        except (OSError, subprocess.SubprocessError) as e:
            done, words = None, str(e)
        if done is None or done.returncode != 0:
            words += "\nminipd kernels: those not prebuilt are built at first use"
        print(words, file=sys.stderr)  # pip shows it with -v
        if not self.editable_mode:
            self.kernel_libraries = [str(p) for p in (package / "prebuilt").glob("*.so")]

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *self.kernel_libraries]


setup(cmdclass={"build_py": BuildPyAndKernels})
