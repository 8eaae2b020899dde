"""Gemma 3 270M base, fetched (gemma3: sliding-window layers, Q5_0/Q8_0/K-quant weights
dequantized, SentencePiece tokenizer): its config comes from the file, its tokenizer gives
transformers' ids for the same file, its logits past the sliding window are transformers', and
`minipd --role both` completes a plain prompt with transformers' greedy tokens. Skipped, saying
how to fetch it, where the file is not in the model cache.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from fetched_models import requires_fetched

from minipd.engine.model_loader import gguf_path, load_tokenizer_only
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.gguf.gguf_loader import config_from_gguf, load_gguf_model

MODEL = "gemma-3-270m"
pytestmark = [requires_fetched(MODEL), pytest.mark.timeout(900)]
RUN_TIMEOUT_S = 600
WINDOW_PLUS = 600  # tokens: past the sliding window of 512
FP32_TOLERANCE = 5e-4  # logits of about 25, as in tests/unit/models/test_gguf_gemma3.py
TEXTS = [
    "The capital of France is",
    "def reverse(s: str) -> str:\n    return s[::-1]\n",
    "  Grüße aus Köln — 東京は晴れです 😀",
]


def test_the_config_has_the_sliding_window_and_global_layers():
    config = config_from_gguf(read_gguf(gguf_path(MODEL)))
    assert config.architecture == "Gemma3ForCausalLM" and config.tie_word_embeddings
    assert (config.sliding_window, config.head_dim, config.num_kv_heads) == (512, 256, 1)
    assert [i for i in range(config.num_layers) if not config.is_sliding(i)] == [5, 11, 17]
    assert (config.rope_theta, config.rope_local_theta) == (1e6, 1e4)


def test_the_tokenizer_gives_transformers_ids():
    from transformers import AutoTokenizer

    path = gguf_path(MODEL)
    ours = load_tokenizer_only(MODEL)
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        ids = ours.encode(text, add_bos=False)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.encode(text)[0] == ours.bos_token_id == 2
        assert ours.decode(ids) == text
    assert ours.eos_token_ids == (1, 106)  # <eos>, <end_of_turn>


def _transformers(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()


def test_role_both_completes_a_plain_prompt_as_transformers_does():
    argv = [sys.executable, "-m", "minipd", "--role", "both", "--model", MODEL, "--prompt", TEXTS[0]]
    argv += ["--max-tokens", "16", "--temperature", "0", "--dtype", "float32"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model {MODEL} loaded" in proc.stderr
    answer = re.search(r"^  output \((\d+) tokens, finish=(\w+)\): (.*)$", proc.stdout, flags=re.M)
    ids = re.search(r"^  token ids: \[(.*)\]$", proc.stdout, flags=re.M)
    assert answer and ids, proc.stdout
    assert "France" in answer.group(3), answer.group(3)  # a base model's plain continuation
    prompt = load_tokenizer_only(MODEL).encode(TEXTS[0])
    with torch.no_grad():
        expected = _transformers(gguf_path(MODEL)).generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
    assert [int(i) for i in ids.group(1).split(", ")] == expected[0, len(prompt) :].tolist()


def test_logits_past_the_window_match_transformers():
    path = gguf_path(MODEL)
    tokenizer = load_tokenizer_only(MODEL)
    ids = torch.tensor(tokenizer.encode(" ".join(TEXTS * 60))[:WINDOW_PLUS])
    ours = load_gguf_model(path)
    with torch.no_grad():
        expected = _transformers(path)(ids[None]).logits[0, -8:]
    assert (ours.forward_reference(ids)[-8:] - expected).abs().max().item() <= FP32_TOLERANCE
