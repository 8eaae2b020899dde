"""`--weights` (EngineConfig.weights): "auto" serves a GGUF's 4-bit tensors as stored, with dense
copies for prefill ("mixed") in bfloat16 on the CPU, without them ("quantized") in float32 where
minipd's int8 kernels run, and dense elsewhere; "quantized" keeps only the 4-bit weights;
"quantized" or "mixed" where they cannot be is refused saying why, and an unknown value names
the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_helpers import TINY, hf_weights, write_llama_gguf

from minipd.engine.config import EngineConfig
from minipd.engine.model_loader import load_model
from minipd.models.kernels import vnni_kernels

CPU = torch.device("cpu")


@pytest.fixture
def q4_file(tmp_path: Path) -> str:
    return str(write_llama_gguf(tmp_path / "tiny.gguf", TINY, hf_weights(TINY), GGMLQuantizationType.Q4_1))


def test_auto_serves_4_bit_weights_mixed_in_bfloat16_and_quantized_in_float32(q4_file: str) -> None:
    assert load_model(q4_file, CPU, torch.bfloat16)[0].weights_format == "mixed"
    assert load_model(q4_file, CPU, torch.bfloat16, weights="quantized")[0].weights_format == "quantized"
    float32 = "quantized" if vnni_kernels.best() is not None else "dense"
    assert load_model(q4_file, CPU, torch.float32)[0].weights_format == float32
    # torch's int4 kernel takes bfloat16 only: float32 with it is served dense
    assert load_model(q4_file, CPU, torch.float32, quantized_kernel="torch")[0].weights_format == "dense"
    assert load_model(q4_file, CPU, torch.bfloat16, weights="dense")[0].weights_format == "dense"
    assert load_model("tiny", CPU, torch.bfloat16)[0].weights_format == "dense"
    assert load_model(q4_file, CPU, torch.float16)[0].weights_format == "dense"


def test_quantized_is_refused_where_it_cannot_be_served(q4_file: str) -> None:
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model("tiny", CPU, torch.bfloat16, weights="quantized")
    with pytest.raises(ValueError, match="bfloat16 or float32, only"):
        load_model(q4_file, CPU, torch.float16, weights="quantized")
    with pytest.raises(ValueError, match="weights: mixed: torch's int4 kernel takes bfloat16 only"):
        load_model(q4_file, CPU, torch.float32, weights="mixed", quantized_kernel="torch")
    with pytest.raises(ValueError, match="weights: mixed: 'tiny' is not a GGUF file"):
        load_model("tiny", CPU, torch.bfloat16, weights="mixed")


def test_an_unknown_weights_value_names_the_field() -> None:
    with pytest.raises(ValueError, match="weights: unknown 'int4'"):
        EngineConfig(weights="int4").validate()
