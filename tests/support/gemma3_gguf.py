"""A tiny random-weight Gemma 3 checkpoint (transformers' Gemma3ForCausalLM) and its GGUF file, as
llama.cpp's converter writes one: arch `gemma3`, every norm stored plus 1, Q/K rows as HF has them,
tied embeddings, and a SentencePiece vocabulary (`tokenizer.ggml.model` "llama": Gemma's special
tokens, the 256 byte-fallback tokens, then BPE pieces learned here on the qwen2 corpus, in merge
order, scored by their place) with no merges.

The model has 6 layers, so with HF's (and llama.cpp's) pattern of 6 the last one attends globally
and the first five slide over a window of `WINDOW` keys, much shorter than the test prompts.
Head size 256 (as Gemma 3's): transformers reads no query_pre_attn_scalar from a GGUF and keeps its
default, 256, which llama.cpp's head-size scaling then equals.
"""

from __future__ import annotations

from pathlib import Path

import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf_helpers import stored
from hf_random import sharpen
from qwen2_gguf import CORPUS
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from minipd.models.gguf.gguf_loader import ARCHITECTURES

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PAD_ID, EOS_ID, BOS_ID, UNK_ID, START_OF_TURN_ID, END_OF_TURN_ID = range(6)
WINDOW = 8
TINY_GEMMA3 = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=256,
    query_pre_attn_scalar=256,
    sliding_window=WINDOW,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attn_implementation="eager",
)
# HF name -> GGUF name, minipd's table turned round (transformers reads the file by its own names)
_LAYER_NAMES = {hf: gguf for gguf, hf in ARCHITECTURES["gemma3"].layer_names.items()}


def spm_vocab(size: int = 400) -> tuple[list[str], list[int]]:
    """(tokens, token types): Gemma's special tokens, `<0x00>`..`<0xFF>`, then pieces ("▁" for
    spaces) BPE-trained on the corpus, ids in merge order."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=size, show_progress=False))
    pieces = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = SPECIAL_TOKENS + byte_tokens + pieces
    types = [TokenType.CONTROL] * len(SPECIAL_TOKENS) + [TokenType.BYTE] * 256 + [TokenType.NORMAL] * len(pieces)
    return tokens, types


def hf_gemma3(vocab_size: int, seed: int = 0, **overrides):
    """A random Gemma3ForCausalLM whose attention is sharp (`hf_random.sharpen`), drawn from `seed`."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        **{**TINY_GEMMA3, **overrides},
    )
    model = Gemma3ForCausalLM(config).eval()
    sharpen(model)
    return model


def write_gemma3_gguf(
    path: Path, model, tokens: list[str], types: list[int], tensor_type: GGMLQuantizationType = GGMLQuantizationType.F32
) -> Path:
    """`model` (an HF Gemma3ForCausalLM) as a gemma3 GGUF file with the vocabulary `tokens`."""
    c = model.config
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_vocab_size(len(tokens))
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_sliding_window(c.sliding_window)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    for name, values in _gguf_tensors(model).items():
        kind = GGMLQuantizationType.F32 if values.ndim == 1 else tensor_type
        raw = None if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else kind
        writer.add_tensor(name, stored(values, kind), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_tensors(model) -> dict:
    """The HF weights under their GGUF names, norms plus 1 (convert_hf_to_gguf.py's Gemma3Model)."""
    weights = {name: t.detach().float().clone() for name, t in model.state_dict().items()}
    out = {
        "token_embd.weight": weights["model.embed_tokens.weight"],
        "output_norm.weight": weights["model.norm.weight"],
    }
    for i in range(model.config.num_hidden_layers):
        out.update({f"blk.{i}.{gg}": weights[f"model.layers.{i}.{hf}"] for hf, gg in _LAYER_NAMES.items()})
    return {name: (t + 1 if name.endswith("norm.weight") else t).numpy() for name, t in out.items()}
