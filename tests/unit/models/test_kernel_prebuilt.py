"""Which library minipd's CPU kernels load (models/kernels/vnni_kernels.py) and what the install-time
build leaves (kernel_build.prebuild), with a stand-in compiler that writes its `-o` file and a
stand-in for torch's dlopen: a current prebuilt library is loaded with no compiler at all; a
stale one (a source edited since) or one that fails to load is passed over and the kernels built
into the cache, saying so; the install-time build names each library for its sources and torch,
replaces stale ones, keeps a current one, and leaves nothing where the compiler is missing or
fails. g++ itself is tests/processes/test_kernel_build.py and test_kernel_install.py."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from minipd.models.kernels import kernel_build, vnni_kernels
from minipd.models.kernels.kernel_build import PREBUILT_ENV, VARIANTS

pytestmark = pytest.mark.skipif(kernel_build.builds_here() is not None, reason=str(kernel_build.builds_here()))
VARIANT = "avx2"
FAKE_CXX = """#!/bin/sh
[ "$1" = --version ] && { echo "fake c++ 1.0"; exit 0; }
while [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done
echo "$out" >> "${0%/*}/calls"
echo library > "$out"
"""
FAILING_CXX = "#!/bin/sh\necho 'fake c++: error: no such instruction' >&2\nexit 1\n"


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Sources copied to tmp (so a test may edit one), empty prebuilt and cache dirs, no compiler on
    the PATH, a CPU with every variant's flags, and dlopen recording what it was asked to load."""
    sources = tmp_path / "sources"
    sources.mkdir()
    for name in ("SOURCES", "HEADERS"):
        copies = tuple(Path(shutil.copy(p, sources)) for p in getattr(kernel_build, name))
        monkeypatch.setattr(kernel_build, name, copies)
    for name in ("prebuilt", "cache", "bin"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv(PREBUILT_ENV, str(tmp_path / "prebuilt"))
    monkeypatch.setenv("MINIPD_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(vnni_kernels, "read_cpu_flags", lambda: frozenset(f for v in VARIANTS.values() for f in v[0]))
    loaded: list[Path] = []
    monkeypatch.setattr(torch.ops, "load_library", lambda path: loaded.append(Path(path)))
    return {"tmp": tmp_path, "sources": sources, "loaded": loaded}


def _prebuilt(kernels: dict, variant: str = VARIANT) -> Path:
    library = kernels["tmp"] / "prebuilt" / f"{variant}_kernels-{kernel_build.prebuilt_key(variant)}.so"
    library.write_text("library")
    return library


def _calls(kernels: dict) -> list[str]:
    calls = kernels["tmp"] / "bin" / "calls"
    return calls.read_text().split() if calls.exists() else []


def test_a_current_prebuilt_library_loads_without_a_compiler(kernels: dict) -> None:
    library = _prebuilt(kernels)
    assert kernel_build.find_compiler() is None
    assert vnni_kernels._load.__wrapped__(VARIANT) is None
    assert kernels["loaded"] == [library] and not list((kernels["tmp"] / "cache").iterdir())


def test_without_a_prebuilt_library_or_a_compiler_the_kernels_say_why(kernels: dict) -> None:
    why = vnni_kernels._load.__wrapped__(VARIANT)
    assert why is not None and "no C++ compiler" in why and "no prebuilt library" in why
    assert kernels["loaded"] == []


def test_a_stale_prebuilt_library_is_passed_over_and_the_kernels_built(
    kernels: dict, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stale = _prebuilt(kernels)
    with kernel_build.SOURCES[0].open("a") as source:
        source.write("// edited since the install\n")
    compiler = _script(kernels["tmp"] / "bin" / "c++", FAKE_CXX)
    monkeypatch.setenv("CXX", compiler)
    with caplog.at_level(logging.WARNING, logger=vnni_kernels.__name__):
        assert vnni_kernels._load.__wrapped__(VARIANT) is None
    (built,) = kernels["loaded"]
    assert built.parent == kernels["tmp"] / "cache" and built.read_text() == "library\n" and stale.exists()
    assert len(_calls(kernels)) == len(kernel_build.SOURCES) + 1  # each source, then the link
    (record,) = caplog.records
    assert record.getMessage().startswith(f"building minipd's {VARIANT} CPU kernels with {compiler} ")


def test_a_prebuilt_library_that_fails_to_load_is_passed_over(
    kernels: dict, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = _prebuilt(kernels)

    def dlopen(path: str) -> None:
        if Path(path) == broken:
            raise OSError(f"{path}: undefined symbol: _ZN3c10")
        kernels["loaded"].append(Path(path))

    monkeypatch.setattr(torch.ops, "load_library", dlopen)
    monkeypatch.setenv("CXX", _script(kernels["tmp"] / "bin" / "c++", FAKE_CXX))
    with caplog.at_level(logging.WARNING, logger=vnni_kernels.__name__):
        assert vnni_kernels._load.__wrapped__(VARIANT) is None
    assert [p.parent.name for p in kernels["loaded"]] == ["cache"]
    assert "did not load" in caplog.text and "undefined symbol" in caplog.text and "building minipd's" in caplog.text


def test_the_install_build_names_each_library_for_its_sources_and_keeps_a_current_one(
    kernels: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = kernels["tmp"] / "out"
    out.mkdir()
    (out / f"{VARIANT}_kernels-0123456789abcdef.so").write_text("stale")
    monkeypatch.setenv("CXX", _script(kernels["tmp"] / "bin" / "c++", FAKE_CXX))
    assert kernel_build.prebuild(out) == dict.fromkeys(VARIANTS)
    expected = sorted(f"{v}_kernels-{kernel_build.prebuilt_key(v)}.so" for v in VARIANTS)
    assert sorted(p.name for p in out.iterdir()) == expected  # the stale one gone, no build directory left
    calls = len(_calls(kernels))
    assert calls == len(VARIANTS) * (len(kernel_build.SOURCES) + 1)
    assert kernel_build.prebuild(out) == dict.fromkeys(VARIANTS) and len(_calls(kernels)) == calls  # kept


def test_the_install_build_without_a_compiler_builds_nothing_and_says_why(kernels: dict) -> None:
    out = kernels["tmp"] / "out"
    assert kernel_build.prebuild(out) == dict.fromkeys(VARIANTS, "no C++ compiler (g++ or $CXX)")
    assert not out.exists()


def test_the_install_build_with_a_failing_compiler_leaves_nothing(
    kernels: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = kernels["tmp"] / "out"
    monkeypatch.setenv("CXX", _script(kernels["tmp"] / "bin" / "c++", FAILING_CXX))
    results = kernel_build.prebuild(out, (VARIANT,))
    assert "no such instruction" in results[VARIANT] and list(out.iterdir()) == []


def test_the_install_build_refuses_an_unknown_variant(kernels: dict) -> None:
    with pytest.raises(ValueError, match="unknown variant"):
        kernel_build.prebuild(kernels["tmp"] / "out", ("sse2",))
