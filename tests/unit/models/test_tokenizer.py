"""Byte tokenizer and tokenizer.json loading: round trips, BOS/EOS, chat template, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from minipd.models.arch.model_config import BYTE_BOS_ID, BYTE_EOS_ID, BYTE_VOCAB_SIZE
from minipd.models.tokenizers.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

ASCII_TEXT = "Hello, world! The quick brown fox."
MULTIBYTE_TEXT = "héllo wörld — 世界 🚀"
BOS, EOS, IM_END = "<s>", "</s>", "<|im_end|>"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
CORPUS = [ASCII_TEXT, MULTIBYTE_TEXT, "the fox jumps over the lazy dog", "hello hello world"] * 20
TRAINED_VOCAB_SIZE = 400


# ---- ByteTokenizer ----------------------------------------------------------------------


@pytest.mark.parametrize("text", [ASCII_TEXT, MULTIBYTE_TEXT, ""])
def test_byte_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids[0] == BYTE_BOS_ID and ids[1:] == list(text.encode("utf-8"))
    assert tok.decode(ids + [BYTE_EOS_ID]) == text


def test_byte_without_bos_and_attributes() -> None:
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.encode("ab", add_bos=False) == [ord("a"), ord("b")]
    assert (tok.bos_token_id, tok.eos_token_ids, tok.vocab_size) == (BYTE_BOS_ID, (BYTE_EOS_ID,), BYTE_VOCAB_SIZE)
    assert tok.chat_template is None
    assert (tok.bos_token, tok.eos_token) == (None, None)  # BOS and EOS are ids beyond the bytes: no text


def test_byte_decode_of_partial_character_replaces_instead_of_raising() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("é", add_bos=False)
    assert len(ids) == 2
    assert tok.decode(ids[:1]) == "\ufffd"
    assert tok.decode(ids) == "é"


# ---- HFTokenizer ------------------------------------------------------------------------


def _train_tokenizer() -> RustTokenizer:
    tokenizer = RustTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB_SIZE,
        special_tokens=[BOS, EOS, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


@pytest.fixture(scope="module")
def trained() -> RustTokenizer:
    return _train_tokenizer()


def _write(
    directory: Path, tokenizer: RustTokenizer, tokenizer_config: dict | None, generation_config: dict | None = None
) -> Path:
    tokenizer.save(str(directory / "tokenizer.json"))
    if tokenizer_config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if generation_config is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation_config))
    return directory


LLAMA_STYLE_CONFIG = {
    "bos_token": {"content": BOS, "lstrip": False, "rstrip": False, "special": True},  # AddedToken form
    "eos_token": EOS,
    "add_bos_token": True,
    "chat_template": CHAT_TEMPLATE,
}


def test_hf_round_trip_bos_eos_and_template(tmp_path: Path, trained: RustTokenizer) -> None:
    tok = load_tokenizer(_write(tmp_path, trained, LLAMA_STYLE_CONFIG, {"eos_token_id": [trained.token_to_id(IM_END)]}))
    assert isinstance(tok, HFTokenizer) and isinstance(tok, Tokenizer)
    bos_id = trained.token_to_id(BOS)
    assert tok.bos_token_id == bos_id
    assert tok.eos_token_ids == (trained.token_to_id(EOS), trained.token_to_id(IM_END))
    assert tok.vocab_size == trained.get_vocab_size(with_added_tokens=True)
    assert tok.chat_template == CHAT_TEMPLATE
    assert (tok.bos_token, tok.eos_token) == (BOS, EOS)
    for text in (ASCII_TEXT, MULTIBYTE_TEXT):
        ids = tok.encode(text)
        assert ids[0] == bos_id and bos_id not in ids[1:]
        assert tok.encode(text, add_bos=False) == ids[1:]
        assert tok.decode(ids + [tok.eos_token_ids[0]]) == text


def test_hf_bos_is_not_doubled_when_text_starts_with_it(tmp_path: Path, trained: RustTokenizer) -> None:
    tok = load_tokenizer(_write(tmp_path, trained, LLAMA_STYLE_CONFIG))
    ids = tok.encode(BOS + ASCII_TEXT)
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id


BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


def test_chat_template_renders_bos_and_eos_text_like_transformers(tmp_path: Path, trained: RustTokenizer) -> None:
    from transformers import PreTrainedTokenizerFast

    from minipd.api.chat_template import ChatTemplate
    from minipd.api.protocol import ChatMessage

    tok = load_tokenizer(_write(tmp_path, trained, {**LLAMA_STYLE_CONFIG, "chat_template": BOS_TEMPLATE}))
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), bos_token=BOS, eos_token=EOS)
    conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    rendered = ChatTemplate.for_tokenizer(tok).render([ChatMessage(m["role"], m["content"]) for m in conversation])
    expected = theirs.apply_chat_template(
        conversation, chat_template=BOS_TEMPLATE, tokenize=False, add_generation_prompt=True
    )
    assert rendered == expected and rendered.startswith(BOS) and rendered.count(EOS) == 2
    ids = tok.encode(rendered)  # the BOS text is read back as the one BOS id, never doubled
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert ids.count(trained.token_to_id(EOS)) == 2


def test_hf_incremental_decode_of_prefixes(tmp_path: Path, trained: RustTokenizer) -> None:
    tok = load_tokenizer(_write(tmp_path, trained, LLAMA_STYLE_CONFIG))
    ids = tok.encode(ASCII_TEXT, add_bos=False)
    assert len(ids) > 1
    streamed = ""
    for end in range(1, len(ids) + 1):
        text = tok.decode(ids[:end])
        assert text.startswith(streamed)
        streamed = text
    assert streamed == ASCII_TEXT


def test_hf_add_bos_token_false_and_no_bos_token(tmp_path: Path, trained: RustTokenizer) -> None:
    no_add = load_tokenizer(_write(tmp_path, trained, {**LLAMA_STYLE_CONFIG, "add_bos_token": False}))
    assert no_add.encode(ASCII_TEXT) == no_add.encode(ASCII_TEXT, add_bos=False)
    qwen_style = tmp_path / "qwen"
    qwen_style.mkdir()
    tok = load_tokenizer(_write(qwen_style, trained, {"bos_token": None, "eos_token": IM_END}))
    assert tok.bos_token_id is None
    assert tok.eos_token_ids == (trained.token_to_id(IM_END),)
    assert tok.encode(ASCII_TEXT) == tok.encode(ASCII_TEXT, add_bos=False)


def test_hf_without_tokenizer_config(tmp_path: Path, trained: RustTokenizer) -> None:
    tok = load_tokenizer(_write(tmp_path, trained, None))
    assert (tok.bos_token_id, tok.eos_token_ids, tok.chat_template) == (None, (), None)
    assert tok.decode(tok.encode(MULTIBYTE_TEXT)) == MULTIBYTE_TEXT


def test_hf_chat_template_file_takes_precedence(tmp_path: Path, trained: RustTokenizer) -> None:
    jinja = "{{ messages[0]['content'] }}"
    _write(tmp_path, trained, LLAMA_STYLE_CONFIG)
    (tmp_path / "chat_template.jinja").write_text(jinja)
    assert load_tokenizer(tmp_path).chat_template == jinja


def test_hf_named_chat_templates_pick_default(tmp_path: Path, trained: RustTokenizer) -> None:
    templates = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": CHAT_TEMPLATE}]
    tok = load_tokenizer(_write(tmp_path, trained, {**LLAMA_STYLE_CONFIG, "chat_template": templates}))
    assert tok.chat_template == CHAT_TEMPLATE


def test_hf_unknown_special_token_is_named(tmp_path: Path, trained: RustTokenizer) -> None:
    _write(tmp_path, trained, {**LLAMA_STYLE_CONFIG, "eos_token": "<|not-there|>"})
    with pytest.raises(ValueError, match="eos_token"):
        load_tokenizer(tmp_path)


def test_missing_tokenizer_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_tokenizer(tmp_path / "nowhere")
