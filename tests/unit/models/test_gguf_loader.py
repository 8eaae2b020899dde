"""The GGUF loader on tiny llama files written by GGUFWriter: every supported tensor type reads
back as the weights it was written from (Q/K permutation undone), transformers reads the same
file the same way, the tokenizer comes from the metadata, and unsupported architectures, tensor
types, features and tokenizers are refused by name."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from engine_helpers import complete, greedy, reference_greedy
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from gguf_helpers import TINY, hf_weights, tiny_vocab, write_llama_gguf

from minipd.engine.model_loader import load_model, load_tokenizer_only
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.gguf.gguf_loader import config_from_gguf, load_gguf_model
from minipd.models.tokenizers.gguf_tokenizer import gguf_tokenizer

Q = GGMLQuantizationType
# Largest |stored - written| per type for these weights (|w| < ~0.6): 0 where the type holds
# them exactly, else a bound that still fails if the wrong type or rows were read.
# (The K-quants need rows of 256: tests/unit/models/test_gguf_kquants.py.)
ROUND_TRIP_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1]
MAX_QUANT_ERROR = {
    **{Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 5e-3, Q.Q8_0: 0.01},
    **{Q.Q5_0: 0.1, Q.Q5_1: 0.05, Q.Q4_0: 0.2, Q.Q4_1: 0.1},
}


def expected_after_storage(values: torch.Tensor, tensor_type: GGMLQuantizationType) -> torch.Tensor:
    """What a tensor written as `tensor_type` holds, by the gguf package's own (de)quantizer. Blocks
    run along rows and llama.cpp's Q/K permutation moves whole rows, so quantizing the unpermuted
    rows gives the same values the loader must return after undoing the permutation."""
    if values.ndim == 1 or tensor_type == Q.F32:
        return values
    if tensor_type == Q.F16:
        return values.to(torch.float16).float()
    return torch.from_numpy(dequantize(quantize(values.numpy(), tensor_type), tensor_type))


@pytest.mark.parametrize("tensor_type", ROUND_TRIP_TYPES, ids=lambda t: t.name)
def test_every_supported_type_reads_back_the_written_weights(tmp_path: Path, tensor_type) -> None:
    weights = hf_weights(TINY)
    model = load_gguf_model(write_llama_gguf(tmp_path / "tiny.gguf", TINY, weights, tensor_type))
    loaded = model.state_dict()
    assert set(loaded) == set(weights)
    worst = 0.0
    for name, written in weights.items():
        assert torch.equal(loaded[name], expected_after_storage(written, tensor_type)), name
        worst = max(worst, (loaded[name] - written).abs().max().item())
    assert worst <= MAX_QUANT_ERROR[tensor_type]
    if tensor_type != Q.F32:
        assert worst > 0, "a lossy type must actually have been stored"


def test_permutation_is_undone_per_head_for_q_and_k(tmp_path: Path) -> None:
    # rows numbered by their HF index: after the round trip each row must be back in its place
    weights = hf_weights(TINY)
    q_name, k_name = "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"
    for name in (q_name, k_name):
        rows = weights[name].shape[0]
        weights[name] = torch.arange(rows, dtype=torch.float32)[:, None].expand_as(weights[name]).clone()
    loaded = load_gguf_model(write_llama_gguf(tmp_path / "rows.gguf", TINY, weights)).state_dict()
    for name in (q_name, k_name):
        assert torch.equal(loaded[name][:, 0], torch.arange(weights[name].shape[0], dtype=torch.float32)), name
    stored = read_gguf(tmp_path / "rows.gguf")
    raw_k = np.asarray(stored.tensor_bytes(stored.tensors["blk.1.attn_k.weight"]).view(np.float32))[:, 0]
    assert raw_k[:4].tolist() == [0.0, 8.0, 1.0, 9.0]  # llama.cpp interleaves each head's halves


@pytest.mark.parametrize("tensor_type", [Q.F32, Q.Q8_0], ids=lambda t: t.name)
def test_transformers_reads_the_same_weights_and_logits(tmp_path: Path, tensor_type) -> None:
    from transformers import AutoModelForCausalLM

    path = write_llama_gguf(tmp_path / "tiny.gguf", TINY, hf_weights(TINY, seed=3), tensor_type)
    ours = load_gguf_model(path)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
    their_weights = theirs.state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, their_weights[name]), name
    ids = torch.tensor([5, 9, 17, 3, 40, 41, 90, 2])
    with torch.no_grad():
        expected = theirs(ids[None]).logits[0]
    assert (ours.forward_reference(ids) - expected).abs().max().item() <= 1e-4


def test_config_comes_from_the_metadata(tmp_path: Path) -> None:
    tied = msgspec.structs.replace(TINY, tie_word_embeddings=True)
    weights = hf_weights(tied)
    file = read_gguf(write_llama_gguf(tmp_path / "tied.gguf", tied, weights))
    config = config_from_gguf(file)
    assert config == msgspec.structs.replace(tied, rms_norm_eps=float(np.float32(tied.rms_norm_eps)))
    model = load_gguf_model(tmp_path / "tied.gguf", dtype=torch.bfloat16)
    assert model.lm_head_weight is model.model.embed_tokens.weight
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_an_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path = write_llama_gguf(tmp_path / "gpt2.gguf", TINY, hf_weights(TINY), arch="gpt2")
    with pytest.raises(ValueError, match=r"architecture 'gpt2'.*supported: \['llama', 'qwen2', 'gemma3'\]"):
        load_gguf_model(path)


def test_the_architecture_is_refused_before_the_tokenizer(tmp_path: Path) -> None:
    """A gemma2 file's tokenizer is not one minipd reads either, but its architecture is what
    `--model` must say (engine and router alike)."""
    vocab = tiny_vocab(TINY)._replace(pre="gemma-bogus")
    path = write_llama_gguf(tmp_path / "gemma2.gguf", TINY, hf_weights(TINY), arch="gemma2", vocab=vocab)
    refused = r"gguf: architecture 'gemma2' \(general.architecture in .*gemma2.gguf\) is not supported"
    with pytest.raises(ValueError, match=refused):
        load_tokenizer_only(str(path))
    with pytest.raises(ValueError, match=refused):
        load_model(str(path), torch.device("cpu"), torch.float32)


def test_an_unsupported_tensor_type_is_named_before_loading(tmp_path: Path) -> None:
    types = {"blk.1.ffn_up.weight": Q.IQ4_NL}
    path = write_llama_gguf(tmp_path / "iq4.gguf", TINY, hf_weights(TINY), tensor_types=types)
    with pytest.raises(ValueError, match=r"'blk\.1\.ffn_up\.weight'.*type IQ4_NL, which is not supported"):
        load_gguf_model(path)


@pytest.mark.parametrize(
    "metadata, words",
    [
        ({"llama.expert_count": 8}, "mixture-of-experts"),
        ({"llama.rope.scaling.type": "yarn"}, "rope.scaling.type 'yarn'"),
        ({"llama.rope.dimension_count": 8}, "partial rotary"),
    ],
)
def test_features_the_model_cannot_reproduce_are_refused(tmp_path: Path, metadata, words) -> None:
    path = write_llama_gguf(tmp_path / "odd.gguf", TINY, hf_weights(TINY), extra_metadata=metadata)
    with pytest.raises(ValueError, match=words):
        load_gguf_model(path)


def test_missing_and_misshapen_tensors_are_refused(tmp_path: Path) -> None:
    weights = hf_weights(TINY)
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing tensors \['model\.layers\.1\.mlp\.up_proj\.weight'\]"):
        load_gguf_model(write_llama_gguf(tmp_path / "missing.gguf", TINY, weights))
    weights = hf_weights(TINY)
    weights["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(TINY.intermediate_size // 2, TINY.hidden_size)
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_gate\.weight'.* has shape \(64, 64\), expected \(128, 64\)"):
        load_gguf_model(write_llama_gguf(tmp_path / "shape.gguf", TINY, weights))


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        read_gguf(path)
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x05")
    with pytest.raises(ValueError, match="truncated"):
        read_gguf(path)
    with pytest.raises(FileNotFoundError):
        read_gguf(tmp_path / "absent.gguf")


def test_the_tokenizer_comes_from_the_metadata_and_unsupported_kinds_are_named(tmp_path: Path) -> None:
    path = write_llama_gguf(tmp_path / "t.gguf", TINY, hf_weights(TINY))
    file = read_gguf(path)
    merged_id = TINY.vocab_size - 1  # the file's last token, '!"', made by its one merge
    tokenizer = gguf_tokenizer(file)
    assert tokenizer.encode('!"#') == tokenizer.encode('!"#', add_bos=False) == [merged_id, 5]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.decode([1, merged_id, 2])) == ("<s>", "</s>", '!"')
    file.metadata["tokenizer.ggml.pre"] = "chatglm-bpe"
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'chatglm-bpe' is not supported"):
        gguf_tokenizer(file)
    file.metadata["tokenizer.ggml.model"] = "llama"
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'llama'.*not supported for architecture 'llama'"):
        gguf_tokenizer(file)


def test_the_engine_serves_a_gguf_path(tmp_path: Path, make_engine, loop_thread) -> None:
    path = write_llama_gguf(tmp_path / "served.gguf", TINY, hf_weights(TINY, seed=5), Q.Q8_0)
    engine = make_engine(model=str(path), dtype="float32", num_blocks=16, max_model_len=128)
    assert engine.model_config == config_from_gguf(read_gguf(path))
    prompt = engine.tokenizer.encode('!"#$%&')
    result = loop_thread.run(complete(engine, prompt, greedy(6)))
    assert result.token_ids == reference_greedy(engine, prompt, 6)
