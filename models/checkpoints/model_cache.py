"""Where fetched model files live: `$MINIPD_MODEL_CACHE`, else `~/.cache/minipd/models`.

`minipd models fetch` writes there (`--cache-dir` chooses another folder for that command) and
`--model NAME` reads from there; nothing else is kept in it but the files, each under its
registry name (`packaged_models.py`), and while a fetch runs, its hidden partial file and
download folder.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MINIPD_MODEL_CACHE"
DEFAULT_CACHE = Path("~/.cache/minipd/models")


def model_cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """`override` when given, else `$MINIPD_MODEL_CACHE` when set and not empty, else the default;
    `~` expanded. The folder need not exist."""
    chosen = override if override is not None else (os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    return Path(chosen).expanduser()
