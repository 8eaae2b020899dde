"""Gemma 3 270M base, fetched (gemma3: sliding-window layers, Q5_0/Q8_0/K-quant weights
dequantized, SentencePiece tokenizer): its config comes from the file, its tokenizer gives
transformers' ids for the same file, and `minipd --role both` completes a plain prompt with the
fact a base model knows. Skipped, saying how to fetch it, where the file is not in the model cache.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from fetched_models import requires_fetched

from minipd.engine.model_loader import gguf_path, load_tokenizer_only
from minipd.models.gguf.gguf_file import read_gguf
from minipd.models.gguf.gguf_loader import config_from_gguf

MODEL = "gemma-3-270m"
pytestmark = [requires_fetched(MODEL), pytest.mark.timeout(900)]
RUN_TIMEOUT_S = 600
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


def test_role_both_completes_a_plain_prompt():
    argv = [sys.executable, "-m", "minipd", "--role", "both", "--model", MODEL, "--prompt", TEXTS[0]]
    argv += ["--max-tokens", "16", "--temperature", "0"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model {MODEL} loaded" in proc.stderr
    answer = re.search(r"^  output \((\d+) tokens, finish=(\w+)\): (.*)$", proc.stdout, flags=re.M)
    assert answer, proc.stdout
    assert "Paris" in answer.group(3), answer.group(3)
