"""Tokenizers: the interface the engine uses, a byte-level one for the presets, and a
Hugging Face `tokenizers` one for real checkpoints (a `tokenizer.json` here, or built from a
GGUF file's metadata by gguf_tokenizer.py).

Streaming contract: `decode` is a pure function of the whole id list, so the engine
decodes the full output so far and emits the difference from the previous text. A
trailing U+FFFD may mean an incomplete multi-byte character that the next token completes,
so callers that stream should hold such a tail back until the sequence finishes.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Sequence

from tokenizers import Tokenizer as _RustTokenizer

from minipd.models.arch.model_config import BYTE_BOS_ID, BYTE_EOS_ID, BYTE_VOCAB_SIZE

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # transformers >= 4.50 saves the template here
GENERATION_CONFIG_FILE = "generation_config.json"

_NUM_BYTE_VALUES = 256
_GIL_SLICE_BYTES = 1 << 16  # bytes turned into ids per call: one call holds the GIL well under a millisecond


class Tokenizer(ABC):
    """Text <-> token ids.

    Attributes (set by every implementation, read-only afterwards):
      bos_token_id: id prepended by `encode(add_bos=True)`, or None when the model has none.
      eos_token_ids: ids that end generation (may be empty).
      bos_token, eos_token: the text of the BOS and EOS tokens as the tokenizer's config names
        them, for chat templates (`{{ bos_token }}`); None when the model names none or the
        token has no text (the byte tokenizer's). `encode` reads that text back as the one
        special id, so a template that starts with `bos_token` still gets a single BOS.
      vocab_size: number of ids `decode` understands (including special tokens).
      chat_template: the Jinja chat template, or None.
      max_token_chars: the most characters of text one token can stand for, so a text of n
        characters encodes to at least n / max_token_chars tokens; None when the tokenizer
        cannot promise a bound (a normalizer may shrink the text first). It lets a server
        refuse a prompt far beyond max_model_len without tokenizing megabytes.
    """

    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    bos_token: str | None
    eos_token: str | None
    vocab_size: int
    chat_template: str | None
    max_token_chars: int | None = None

    @abstractmethod
    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`; with `add_bos`, starting with exactly one BOS when the model has one.

        Servers call it on worker threads, so it must not hold the GIL for long at a time
        (however long the text), or the event loop would stall meanwhile."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` with special tokens (BOS, EOS, ...) left out; never raises on odd ids."""


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, plus BOS and EOS (the presets' vocabulary)."""

    def __init__(self) -> None:
        self.bos_token_id = BYTE_BOS_ID
        self.eos_token_ids = (BYTE_EOS_ID,)
        self.bos_token = self.eos_token = None  # ids outside the bytes: no text spells them
        self.vocab_size = BYTE_VOCAB_SIZE
        self.chat_template = None
        self.max_token_chars = 1  # one id per UTF-8 byte, and a character is at least one byte

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        data = text.encode("utf-8")
        ids = [BYTE_BOS_ID] if add_bos else []
        for start in range(0, len(data), _GIL_SLICE_BYTES):  # slices: other threads run in between
            ids.extend(data[start : start + _GIL_SLICE_BYTES])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < _NUM_BYTE_VALUES).decode("utf-8", errors="replace")


def _token_content(token: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content")
    return token


def _read_json(file: Path) -> dict[str, Any]:
    return json.loads(file.read_text()) if file.is_file() else {}


def _chat_template(directory: Path, tokenizer_config: dict[str, Any]) -> str | None:
    jinja = directory / CHAT_TEMPLATE_FILE
    if jinja.is_file():
        return jinja.read_text()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # several named templates: [{"name": ..., "template": ...}]
        named = {entry.get("name"): entry.get("template") for entry in template}
        return named.get("default")
    return template


class HFTokenizer(Tokenizer):
    """A `tokenizers` tokenizer plus its special tokens (from tokenizer_config.json, or from a
    GGUF file's metadata, see gguf_tokenizer.py).

    BOS is added by `encode` itself rather than by the tokenizer's post-processor, so that
    `add_bos` means the same for every checkpoint; `add_bos=False` here (tokenizer_config.json's
    `add_bos_token: false`) turns it off. EOS ids are `eos_token`'s id plus
    `extra_eos_token_ids` (generation_config.json's `eos_token_id`: chat models list several).
    """

    def __init__(
        self,
        tokenizer: _RustTokenizer,
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos: bool = True,
        chat_template: str | None = None,
        extra_eos_token_ids: Sequence[int] = (),
    ):
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        # A vocabulary string is at least as long as the text its token stands for (byte-level
        # BPE: one character per byte; metaspace: one per character; byte fallback and WordPiece:
        # longer), unless a normalizer rewrites the text before it is split.
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.max_token_chars = max(map(len, vocab), default=1) if tokenizer.normalizer is None else None
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_token_id = self._special_id(bos_token, "bos_token")
        self._add_bos = add_bos
        eos_token_id = self._special_id(eos_token, "eos_token")
        eos_ids = ([] if eos_token_id is None else [eos_token_id]) + [int(i) for i in extra_eos_token_ids]
        self.eos_token_ids = tuple(dict.fromkeys(eos_ids))  # dedupe, keep order

    def _special_id(self, content: str | None, field: str) -> int | None:
        if content is None:
            return None
        token_id = self._tokenizer.token_to_id(content)
        if token_id is None:
            raise ValueError(f"tokenizer: {field} {content!r} is not in the vocabulary")
        return token_id

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        # encode_batch releases the GIL while it encodes (encode does not), so a thread that
        # tokenizes a huge prompt does not stop the event loop (minipd/engine/prompt_encoder.py)
        ids = self._tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        wants_bos = add_bos and self._add_bos and self.bos_token_id is not None
        # A rendered chat template often starts with the BOS text already; never double it.
        if wants_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        valid = [i for i in ids if 0 <= i < self.vocab_size]
        return self._tokenizer.decode(valid, skip_special_tokens=True)


def load_tokenizer(path: str | Path) -> HFTokenizer:
    """Load the HF tokenizer in directory `path` (tokenizer.json, and when present
    tokenizer_config.json, chat_template.jinja and generation_config.json).

    Raises FileNotFoundError naming the missing directory or tokenizer.json.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"tokenizer: directory {directory} does not exist")
    tokenizer_file = directory / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise FileNotFoundError(
            f"tokenizer: {tokenizer_file} does not exist (only tokenizer.json tokenizers are supported)"
        )
    tokenizer_config = _read_json(directory / TOKENIZER_CONFIG_FILE)
    generation_eos = _read_json(directory / GENERATION_CONFIG_FILE).get("eos_token_id")
    if isinstance(generation_eos, int):
        generation_eos = [generation_eos]
    return HFTokenizer(
        _RustTokenizer.from_file(str(tokenizer_file)),
        bos_token=_token_content(tokenizer_config.get("bos_token")),
        eos_token=_token_content(tokenizer_config.get("eos_token")),
        add_bos=bool(tokenizer_config.get("add_bos_token", True)),
        chat_template=_chat_template(directory, tokenizer_config),
        extra_eos_token_ids=generation_eos or (),
    )
