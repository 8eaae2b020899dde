"""A tiny random-weight Qwen2 checkpoint (transformers' Qwen2ForCausalLM) and its GGUF file, as
llama.cpp's converter writes one: arch `qwen2`, q/k/v biases, Q/K rows as HF has them, and a
byte-level BPE vocabulary trained here on a small mixed corpus with the pre-tokenizer named
`pre` ("qwen2" or "llama-bpe"), Qwen's special tokens and a ChatML chat template.

Dimensions are multiples of 256 so every matrix can be stored in a K-quant too.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from gguf import GGMLQuantizationType, TokenType
from gguf_helpers import GGUFVocab, write_llama_gguf
from hf_random import sharpen
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

from minipd.models.checkpoints.hf_loader import config_from_hf
from minipd.models.tokenizers.gguf_tokenizer import LLAMA3_SPLIT, QWEN2_SPLIT

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a terse assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CORPUS = [
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 1024; ++i) { total += values[i] * 31; }",
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,000 apples.",
    "    indented   text\twith tabs\r\nand windows line ends\n\n\nthree blank lines",
    "机器学习很有趣。我们今天学习分词器。東京は晴れです。",
    "import numpy as np\nx = np.arange(100).reshape(10, 10)\nprint(x.sum())  # 4950\n",
    "Don't, won't, I'M, YOU'LL, she'd -- contractions in MIXED case; naïve café résumé.",
] * 4
SPLITS = {"qwen2": QWEN2_SPLIT, "llama-bpe": LLAMA3_SPLIT}
TINY_QWEN2 = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attn_implementation="eager",
)


def trained_vocab(pre: str = "qwen2", size: int = 420) -> GGUFVocab:
    """A byte-level BPE vocabulary (all 256 bytes, then merges learned on `CORPUS` split by
    `pre`'s regex) followed by Qwen's special tokens; BOS <|endoftext|> (not added), EOS <|im_end|>."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    tokens = [token for token, _ in by_id] + SPECIAL_TOKENS
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    types = [TokenType.NORMAL] * len(by_id) + [TokenType.CONTROL] * len(SPECIAL_TOKENS)
    return GGUFVocab(
        tokens=tokens,
        token_types=types,
        merges=merges,
        pre=pre,
        bos_token_id=tokens.index("<|endoftext|>"),
        eos_token_id=tokens.index("<|im_end|>"),
        add_bos=False,
        chat_template=CHATML_TEMPLATE,
    )


def hf_qwen2(vocab_size: int, seed: int = 0, **overrides):
    """A random Qwen2ForCausalLM whose attention is sharp (`hf_random.sharpen`), drawn from `seed`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_size, **{**TINY_QWEN2, **overrides})).eval()
    sharpen(model)
    return model


def write_qwen2_gguf(
    path: Path,
    model,
    vocab: GGUFVocab,
    tensor_type: GGMLQuantizationType = GGMLQuantizationType.F32,
    tensor_types: dict[str, GGMLQuantizationType] | None = None,
) -> Path:
    """`model` (an HF Qwen2ForCausalLM) as a qwen2 GGUF file with `vocab`."""
    config = config_from_hf(model.config.to_dict())
    weights = {name: t.detach().float().clone() for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    return write_llama_gguf(path, config, weights, tensor_type, arch="qwen2", tensor_types=tensor_types, vocab=vocab)
