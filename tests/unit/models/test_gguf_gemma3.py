"""A gemma3 GGUF (sliding-window layers with a global one, norms stored plus 1, q/k norms, tied
embeddings, SentencePiece vocabulary) written from a tiny random transformers Gemma3ForCausalLM
loads into minipd with the logits transformers gets from the same file and from the checkpoint it
came from, on prompts far longer than the window; the window and the norms' shift both matter;
the engine serves it in prefill chunks and decodes past the window with transformers' greedy
tokens; the tokenizer gives transformers' ids for the same file; and it is served with dense
weights through torch's ops (no 4-bit, fused decode or prefill kernels)."""

from __future__ import annotations

import msgspec
import pytest
import torch
from engine_helpers import complete, complete_all, greedy, reference_greedy
from gemma3_gguf import BOS_ID, END_OF_TURN_ID, EOS_ID, WINDOW, hf_gemma3, spm_vocab, write_gemma3_gguf
from gguf_parity import from_gguf, max_diff, prompts

from minipd.models.arch.gemma3 import Gemma3ForCausalLM
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.gguf.gguf_loader import auto_weights, config_from_gguf, load_gguf_model
from minipd.models.kernel_steps import fused_decode, prefill_kernels
from minipd.models.tokenizers.gguf_tokenizer import gguf_tokenizer

# Logits reach 27 here (qwen2's test: 9), so float32 rounding reaches further: transformers from the
# file and from the checkpoint differ by 6.5e-5 between themselves, minipd (SDPA) from either by
# 2.2e-4 at most, on the 100-token prompt, when written.
FP32_TOLERANCE = 5e-4
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n: int) -> int:\n    return n",
    "  two leading spaces,   three inside, tabs\tand\nnew lines",
    "机器学习很有趣 and unseen ones: 😀 ñ Ω",
    "a control <bos> token in the text<eos>",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(the HF model, its F32 GGUF)."""
    tokens, types = spm_vocab()
    hf = hf_gemma3(len(tokens), seed=3)
    return hf, write_gemma3_gguf(tmp_path_factory.mktemp("gemma3") / "gemma3.gguf", hf, tokens, types)


def test_the_config_comes_from_the_gemma3_metadata(checkpoint) -> None:
    hf, path = checkpoint
    config = config_from_gguf(read_gguf(path))
    assert config.architecture == "Gemma3ForCausalLM" and config.tie_word_embeddings
    assert (config.sliding_window, config.sliding_window_pattern) == (WINDOW, 6)
    assert [config.is_sliding(i) for i in range(6)] == [True] * 5 + [False]
    assert (config.rope_theta, config.rope_local_theta, config.query_pre_attn_scalar) == (1e6, 1e4, 256.0)
    assert (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim) == (256, 2, 1, 256)
    assert config.final_logit_softcapping is None and config.vocab_size == hf.config.vocab_size


def test_logits_match_transformers_from_the_file_and_the_checkpoint(checkpoint) -> None:
    hf, path = checkpoint
    ours = load_gguf_model(path)
    assert isinstance(ours, Gemma3ForCausalLM)
    vocab_size = hf.config.vocab_size
    assert max_diff(ours, from_gguf(path), vocab_size) <= FP32_TOLERANCE
    assert max_diff(ours, hf, vocab_size) <= FP32_TOLERANCE


def test_the_window_and_the_norm_shift_both_matter(checkpoint) -> None:
    hf, path = checkpoint
    ours = load_gguf_model(path)
    ids = prompts(hf.config.vocab_size)[2]  # 33 tokens, past the window of 8
    logits = ours.forward_reference(ids)
    windowed = ours.config
    ours.config = msgspec.structs.replace(windowed, sliding_window=len(ids))  # the same layers, no key too old
    assert (ours.forward_reference(ids)[WINDOW:] - logits[WINDOW:]).abs().max().item() > 100 * FP32_TOLERANCE
    # within the window, the window hides nothing
    assert (ours.forward_reference(ids)[:WINDOW] - logits[:WINDOW]).abs().max().item() <= FP32_TOLERANCE
    ours.config = windowed
    with torch.no_grad():
        ours.model.norm.weight.add_(1.0)  # the norm as stored, plus 1 once more
    assert (ours.forward_reference(ids) - logits).abs().max().item() > 100 * FP32_TOLERANCE


def test_the_engine_prefills_in_chunks_and_decodes_past_the_window(checkpoint, make_engine, loop_thread) -> None:
    hf, path = checkpoint
    engine = make_engine(
        model=str(path), dtype="float32", num_blocks=64, block_size=4, max_num_batched_tokens=16, max_model_len=128
    )
    gen = torch.Generator().manual_seed(1)
    batch = [torch.randint(6, hf.config.vocab_size, (n,), generator=gen).tolist() for n in (5, 23, 40)]
    results = loop_thread.run(complete_all(engine, batch, greedy(20)))
    for prompt, result in zip(batch, results):
        assert result.token_ids == reference_greedy(engine, prompt, 20)
    prompt = batch[-1]
    with torch.no_grad():
        expected = from_gguf(path).generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)
    alone = loop_thread.run(complete(engine, prompt, greedy(20)))
    assert alone.token_ids == results[-1].token_ids == expected[0, len(prompt) :].tolist()
    assert len(set(alone.token_ids)) > 1


def test_the_tokenizer_gives_transformers_ids(checkpoint) -> None:
    from transformers import AutoTokenizer

    _, path = checkpoint
    ours = gguf_tokenizer(read_gguf(path))
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        ids = ours.encode(text, add_bos=False)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.encode(text) == [BOS_ID, *ids]
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.eos_token_ids == (EOS_ID, END_OF_TURN_ID)
    assert ours.encode("<start_of_turn>user", add_bos=False)[0] == theirs.convert_tokens_to_ids("<start_of_turn>")
    assert len(ours.encode(TEXTS[0], add_bos=False)) < len(TEXTS[0]) // 2  # the pieces merge
    assert "<0xF0>" in theirs.convert_ids_to_tokens(ours.encode("😀", add_bos=False))  # byte fallback


def test_it_is_served_dense_through_torchs_ops(checkpoint) -> None:
    _, path = checkpoint
    file = read_gguf(path)
    assert auto_weights(file, "cpu", torch.bfloat16) == auto_weights(file, "cpu", torch.float32) == "dense"
    with pytest.raises(ValueError, match="weights: quantized: gemma3 models are served with dense weights only"):
        load_gguf_model(path, weights="quantized")
    model = load_gguf_model(path)
    assert "sliding-window" in fused_decode.unsupported(model)
    assert "sliding-window" in prefill_kernels.unsupported(model, torch.float32)
