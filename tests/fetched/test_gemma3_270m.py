"""Gemma 3 270M, fetched: `--model gemma-3-270m` is refused naming its architecture (gemma3 is
not served yet), by an engine and by the router alike, before any weight is read."""

from __future__ import annotations

import pytest
import torch
from fetched_models import requires_fetched

from minipd.engine.model_loader import load_model, load_tokenizer_only

pytestmark = requires_fetched("gemma-3-270m")

REFUSED = r"gguf: architecture 'gemma3' \(general.architecture in .*gemma-3-270m-q4_k_m.gguf\) is not supported"


def test_gemma3_is_refused_naming_its_architecture():
    with pytest.raises(ValueError, match=REFUSED):
        load_tokenizer_only("gemma-3-270m")
    with pytest.raises(ValueError, match=REFUSED):
        load_model("gemma-3-270m", torch.device("cpu"), torch.float32)
