"""The HF loader reproduces transformers' logits for Llama and Qwen2 checkpoints, and
refuses what it cannot load with errors that name the culprit."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import torch
from hf_random import sharpen
from safetensors.torch import load_file, save_file

from minipd.models.arch.llama import LlamaForCausalLM
from minipd.models.checkpoints.hf_loader import config_from_hf, load_hf_model

transformers = pytest.importorskip("transformers")

PROMPT_LENGTHS = (1, 7, 33, 100)
FP32_TOLERANCE = 1e-4
# A wrong RoPE must move the logits by far more than the fp32 tolerance.
SENSITIVITY_MIN_DIFF = 1e-2
SEED = 0

TINY = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    attn_implementation="eager",
)
LLAMA3_SCALING = dict(
    rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32
)
LINEAR_SCALING = dict(rope_type="linear", factor=4.0)
YARN_SCALING = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)


def _hf_model(arch: str, **overrides):
    torch.manual_seed(SEED)
    # transformers fills defaults into the rope dict it is given; keep the constants intact.
    overrides = {k: dict(v) if isinstance(v, dict) else v for k, v in overrides.items()}
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[arch]
    model = model_cls(config_cls(**{**TINY, **overrides})).eval()
    sharpen(model)
    return model


def _max_diff_per_length(hf_model, ours: LlamaForCausalLM) -> dict[int, float]:
    gen = torch.Generator().manual_seed(SEED)
    diffs = {}
    for length in PROMPT_LENGTHS:
        ids = torch.randint(0, hf_model.config.vocab_size, (length,), generator=gen)
        with torch.no_grad():
            expected = hf_model(ids[None]).logits[0].float()
        diffs[length] = (ours.forward_reference(ids) - expected).abs().max().item()
    return diffs


def _assert_parity(hf_model, ours: LlamaForCausalLM) -> None:
    diffs = _max_diff_per_length(hf_model, ours)
    assert all(d <= FP32_TOLERANCE for d in diffs.values()), diffs


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True}),
        ("llama", {"rope_scaling": LLAMA3_SCALING}),
        ("llama", {"rope_scaling": LINEAR_SCALING}),
        ("llama", {"rope_scaling": YARN_SCALING}),
        ("qwen2", {}),
        ("qwen2", {"tie_word_embeddings": True}),
    ],
    ids=["llama", "llama-tied", "llama3-rope", "linear-rope", "yarn-rope", "qwen2", "qwen2-tied"],
)
def test_logits_match_transformers(tmp_path: Path, arch: str, overrides: dict) -> None:
    hf_model = _hf_model(arch, **overrides)
    hf_model.save_pretrained(tmp_path)
    ours = load_hf_model(tmp_path)
    assert ours.config.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert ours.config.attention_bias == (arch == "qwen2")
    _assert_parity(hf_model, ours)


@pytest.mark.parametrize("scaling", [LLAMA3_SCALING, LINEAR_SCALING, YARN_SCALING], ids=lambda s: s["rope_type"])
def test_parity_check_detects_missing_rope_scaling(tmp_path: Path, scaling: dict) -> None:
    """Guards the parity test itself: dropping the scaling must break parity."""
    hf_model = _hf_model("llama", rope_scaling=scaling)
    hf_model.save_pretrained(tmp_path)
    loaded = load_hf_model(tmp_path)
    assert loaded.config.rope_scaling is not None and loaded.config.rope_scaling.rope_type == scaling["rope_type"]
    unscaled = LlamaForCausalLM(msgspec.structs.replace(loaded.config, rope_scaling=None))
    unscaled.load_state_dict(loaded.state_dict())
    diffs = _max_diff_per_length(hf_model, unscaled)
    assert diffs[max(PROMPT_LENGTHS)] > SENSITIVITY_MIN_DIFF, diffs


def test_transformers4_config_layout(tmp_path: Path) -> None:
    """rope_theta and rope_scaling ("type" key) at the top level, as transformers 4.x writes."""
    hf_model = _hf_model("llama", rope_scaling=LLAMA3_SCALING, rope_theta=5000.0)
    hf_model.save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    hf = json.loads(config_file.read_text())
    rope = hf.pop("rope_parameters")
    hf["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    hf["rope_scaling"] = rope
    config_file.write_text(json.dumps(hf))
    ours = load_hf_model(tmp_path)
    assert ours.config.rope_theta == 5000.0
    _assert_parity(hf_model, ours)


def test_sharded_checkpoint(tmp_path: Path) -> None:
    hf_model = _hf_model("qwen2")
    hf_model.save_pretrained(tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    _assert_parity(hf_model, load_hf_model(tmp_path))


def test_shards_without_index_are_globbed(tmp_path: Path) -> None:
    hf_model = _hf_model("llama")
    hf_model.save_pretrained(tmp_path, max_shard_size="50KB")
    (tmp_path / "model.safetensors.index.json").unlink()
    _assert_parity(hf_model, load_hf_model(tmp_path))


def test_dtype_and_ignored_buffers(tmp_path: Path) -> None:
    hf_model = _hf_model("llama")
    hf_model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = _load_tensors(weights)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, str(weights))
    ours = load_hf_model(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in ours.parameters())
    expected = hf_model.model.embed_tokens.weight.to(torch.bfloat16)
    assert torch.equal(ours.model.embed_tokens.weight, expected)


def _load_tensors(file: Path) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in load_file(str(file)).items()}


def _saved_tied_llama(tmp_path: Path) -> tuple[object, dict[str, torch.Tensor]]:
    hf_model = _hf_model("llama", tie_word_embeddings=True)
    hf_model.save_pretrained(tmp_path)
    return hf_model, _load_tensors(tmp_path / "model.safetensors")


def test_tied_model_accepts_equal_lm_head(tmp_path: Path) -> None:
    hf_model, tensors = _saved_tied_llama(tmp_path)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    _assert_parity(hf_model, load_hf_model(tmp_path))


def test_tied_model_rejects_different_lm_head(tmp_path: Path) -> None:
    _, tensors = _saved_tied_llama(tmp_path)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        load_hf_model(tmp_path)


# ---- errors ---------------------------------------------------------------------------


def _write_config(directory: Path, hf: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf))


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    _write_config(tmp_path, {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64})
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_hf_model(tmp_path)


def test_missing_directory_and_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_hf_model(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_model(tmp_path)


def test_missing_weights(tmp_path: Path) -> None:
    _hf_model("llama").config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_hf_model(tmp_path)


def test_missing_shard_is_named(tmp_path: Path) -> None:
    _hf_model("llama").save_pretrained(tmp_path, max_shard_size="50KB")
    shard = sorted(tmp_path.glob("*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        load_hf_model(tmp_path)


def test_missing_and_unexpected_tensors_are_listed(tmp_path: Path) -> None:
    _hf_model("llama").save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = _load_tensors(weights)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.1.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match=r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]") as info:
        load_hf_model(tmp_path)
    assert "model.layers.1.mlp.extra.weight" in str(info.value)


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    _hf_model("llama").save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = _load_tensors(weights)
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_hf_model(tmp_path)


# ---- config_from_hf on hand-written dicts -----------------------------------------------

BASE_HF = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def test_config_defaults_and_eos_list() -> None:
    config = config_from_hf({**BASE_HF, "eos_token_id": [5, 7], "bos_token_id": 1})
    assert (config.num_kv_heads, config.head_dim) == (4, 16)
    assert config.eos_token_ids == (5, 7) and config.bos_token_id == 1
    assert config.rope_scaling is None and config.attention_bias is False
    assert config_from_hf({**BASE_HF, "eos_token_id": 2}).eos_token_ids == (2,)


def test_config_model_type_without_architectures() -> None:
    hf = {k: v for k, v in BASE_HF.items() if k != "architectures"}
    config = config_from_hf({**hf, "model_type": "qwen2", "attention_bias": False})
    assert config.architecture == "Qwen2ForCausalLM" and config.attention_bias is True


def test_config_rope_default_type_means_no_scaling() -> None:
    config = config_from_hf({**BASE_HF, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert config.rope_scaling is None and config.rope_theta == 1e6


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"mlp_bias": True}, "mlp_bias"),
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "linear"}}, "factor"),
    ],
)
def test_config_unsupported_features_are_named(extra: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        config_from_hf({**BASE_HF, **extra})


def test_config_sliding_window_qwen2_is_refused() -> None:
    with pytest.raises(ValueError, match="use_sliding_window"):
        config_from_hf({**BASE_HF, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True})


def test_config_missing_required_field_is_named() -> None:
    hf = {k: v for k, v in BASE_HF.items() if k != "intermediate_size"}
    with pytest.raises(ValueError, match="intermediate_size"):
        config_from_hf(hf)
