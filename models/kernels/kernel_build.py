"""Building minipd's CPU kernels with g++: the variants, their flags, one variant's library, its
cache and prebuilt names, and the install-time build of every variant (`prebuild`).

It imports nothing of minipd's and torch only inside functions, so that the install step
(setup.py) can run it as a script in the interpreter it installs into:
`python -I kernel_build.py OUT_DIR [VARIANT ...]` builds the variants (all, without names) into
OUT_DIR and prints a line for each; it exits 1 when any was not built, never leaving a partial
library behind.

A variant's library depends on its sources and headers, torch's version and its flags, and on
the compiler that built it. The run-time cache (`vnni_kernels`) is keyed by all of them
(`cache_key`); a prebuilt library, built once at install by whatever compiler was there, by
all but the compiler (`prebuilt_key`), so that it loads without one. An edited source or another
torch changes the key, and the stale library is not found.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
# Built into one library: the int8 matmuls (vnni_kernels.cpp), the fused decode step (kernel_steps/fused_decode.py;
# it includes the header too) and the float32 prefill kernels (kernel_steps/prefill_kernels.py).
SOURCES = tuple(
    HERE / name for name in ("vnni_kernels.cpp", "fused_decode.cpp", "prefill_attention.cpp", "row_ops.cpp")
)
HEADERS = tuple(HERE / name for name in ("int8_kernels.h", "kquant_tiles.h", "block_matmul.h", "avx2_math.h"))
BUILD_TIMEOUT_S = 600  # one g++ call
PREBUILT_ENV = "MINIPD_KERNEL_PREBUILT"  # where prebuilt libraries are looked for, instead of PREBUILT


class Variant(NamedTuple):
    cpu_flags: tuple[str, ...]  # Linux's names in /proc/cpuinfo, all needed
    compile_flags: tuple[str, ...]


# Fastest first: `vnni_kernels.best()` takes the first that runs here.
VARIANTS = {
    "vnni": Variant(
        ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "f16c", "fma"),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx512bf16", "-mf16c", "-mfma"),
    ),
    "avx2": Variant(("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")),
}
PREBUILT = HERE / "prebuilt"  # what the install step builds; package data of the installed package


def find_compiler() -> str | None:
    """$CXX, else g++ or c++ on the PATH, else None."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def builds_here() -> str | None:
    """Why no variant can be built or run on this machine (not x86-64 Linux), or None."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"minipd's kernels run on x86-64 Linux only, not {platform.system()} {platform.machine()}"
    return None


def _flags(variant: str) -> tuple[list[str], list[str]]:
    """(compile flags, link flags) of `variant` against this torch."""
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    compile_flags = [
        "-O3", "-fPIC", "-std=c++17", "-w", "-fopenmp", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-DMINIPD_OPS=minipd_{variant}", *VARIANTS[variant].compile_flags, *(f"-I{p}" for p in include_paths()),
    ]  # fmt: skip
    link_flags = [f"-L{p}" for p in library_paths()] + [f"-Wl,-rpath,{p}" for p in library_paths()]
    return compile_flags, [*link_flags, "-lc10", "-ltorch_cpu", "-ltorch"]


def compile_library(compiler: str, output: Path, variant: str) -> None:
    """Build `variant`'s library at `output`: each source compiled on its own, as many at once as
    this process has cores (each parses torch's headers: ~8 s a source, 30 s in one serial
    g++ call against 18 s on two cores), then linked. RuntimeError with the compiler's words."""
    compile_flags, link_flags = _flags(variant)
    objects = [output.with_name(f"{output.stem}.{source.stem}.o") for source in SOURCES]

    def run(command: list[str]) -> None:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"building the {variant} kernels failed:\n{done.stderr[-2000:]}")

    jobs = max(1, min(len(SOURCES), len(os.sched_getaffinity(0))))
    try:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:  # g++ runs outside the GIL
            commands = [[compiler, *compile_flags, "-c", str(s), "-o", str(o)] for s, o in zip(SOURCES, objects)]
            list(pool.map(run, commands))
        run([compiler, "-shared", "-fopenmp", *map(str, objects), "-o", str(output), *link_flags])
    finally:
        for path in objects:
            path.unlink(missing_ok=True)


def _key(variant: str, compiler_version: str | None) -> str:
    import torch

    sources = [p.read_bytes() for p in (*SOURCES, *HEADERS)]
    flags = " ".join(VARIANTS[variant].compile_flags).encode()
    compiler = [] if compiler_version is None else [compiler_version.encode()]
    return hashlib.sha256(b"\0".join([*sources, torch.__version__.encode(), *compiler, flags])).hexdigest()[:16]


def cache_key(variant: str, compiler: str) -> str:
    """The run-time cache's key: `variant`'s sources, torch, `compiler`'s --version and flags."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    return _key(variant, version)


def prebuilt_key(variant: str) -> str:
    """A prebuilt library's key: `variant`'s sources, torch and flags (any compiler)."""
    return _key(variant, None)


def prebuilt_dir() -> Path:
    """Where prebuilt libraries are looked for: $MINIPD_KERNEL_PREBUILT, else PREBUILT."""
    return Path(os.environ.get(PREBUILT_ENV) or PREBUILT)


def prebuilt_library(variant: str) -> Path | None:
    """The prebuilt library of `variant` for these sources and this torch, or None (absent or stale)."""
    library = prebuilt_dir() / f"{variant}_kernels-{prebuilt_key(variant)}.so"
    return library if library.is_file() else None


def prebuild(out_dir: Path, variants: tuple[str, ...] = tuple(VARIANTS)) -> dict[str, str | None]:
    """Build each of `variants` into `out_dir` under its prebuilt name, one after another (each
    uses every core), keeping a library that is already current and removing the variant's stale
    ones. Returns why each was not built (None: it is there). Never raises for a compiler or
    platform: a failed variant leaves nothing behind. ValueError for an unknown variant."""
    if unknown := [v for v in variants if v not in VARIANTS]:
        raise ValueError(f"minipd kernels: unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    compiler = find_compiler()
    why_not = builds_here() or (None if compiler else "no C++ compiler (g++ or $CXX)")
    if why_not is not None:
        return dict.fromkeys(variants, why_not)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, str | None] = {}
    for variant in variants:
        library = out_dir / f"{variant}_kernels-{prebuilt_key(variant)}.so"
        for stale in out_dir.glob(f"{variant}_kernels-*.so"):
            if stale != library:
                stale.unlink()
        results[variant] = None
        if library.is_file():
            continue
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            try:
                compile_library(compiler, Path(tmp) / library.name, variant)
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                results[variant] = str(e)
                continue
            os.replace(Path(tmp) / library.name, library)  # atomic: nobody loads a half-written library
    return results


def main(argv: list[str]) -> int:
    """`kernel_build.py OUT_DIR [VARIANT ...]`: prebuild, a line per variant; 1 when any was not built."""
    if not argv:
        print(f"usage: kernel_build.py OUT_DIR [{' '.join(VARIANTS)}]", file=sys.stderr)
        return 2
    start = time.monotonic()
    try:
        import torch  # noqa: F401  (the libraries are built against it)
    except ImportError as e:
        print(f"minipd kernels: not prebuilt (no torch in {sys.executable}: {e})")
        return 1
    results = prebuild(Path(argv[0]), tuple(argv[1:]) or tuple(VARIANTS))
    for variant, why in results.items():
        print(f"minipd kernels: {variant} " + ("prebuilt" if why is None else f"not prebuilt ({why})"))
    print(f"minipd kernels: {time.monotonic() - start:.1f} s into {argv[0]}")
    return 0 if all(why is None for why in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
