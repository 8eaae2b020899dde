"""Prompts of a requested token length, cut from the built-in corpus.

`PromptBuilder.prompt(index, n)` gives text that the server counts as `n` prompt tokens: a
unique head (the run's tag and the request's index, so no two prompts share a KV block and
prefix caching cannot flatter a run), then corpus sentences drawn by a seeded generator,
cut to `n - special_tokens` tokens of the prompt tokenizer. `special_tokens` (what the
server adds, e.g. BOS) is measured against the server's `usage.prompt_tokens` by the
runner's warm-up. The tokenizer is the served model's own (`tokenizers`, or `transformers`
for a GGUF file), or bytes for the byte-level presets, where one token is one byte.
"""

from __future__ import annotations

import random
from typing import Protocol, Sequence

from minipd.ops.loadgen.corpus import SENTENCES

MIN_BODY_TOKENS = 1


class PromptTokens(Protocol):
    """A tokenizer without special tokens: what the prompt text itself counts as."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokens:
    """The presets' byte-level vocabulary: one token per UTF-8 byte."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="ignore")


class HFTokens:
    """A Hugging Face `tokenizers.Tokenizer` (the fast tokenizer of a checkpoint)."""

    def __init__(self, tokenizer, name: str):
        self._tokenizer, self.name = tokenizer, name

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)


class PromptBuilder:
    def __init__(self, tokens: PromptTokens, seed: int, special_tokens: int = 0):
        self.tokens, self.seed, self.special_tokens = tokens, seed, special_tokens

    def count(self, text: str) -> int:
        """Prompt tokens the server should count for `text`."""
        return len(self.tokens.encode(text)) + self.special_tokens

    def prompt(self, run_tag: str, index: int | str, num_tokens: int) -> str:
        """Text the server counts as `num_tokens` tokens (exactly for bytes, to within a token
        or two for a tokenizer whose pieces merge differently once the text is cut)."""
        body_tokens = max(MIN_BODY_TOKENS, num_tokens - self.special_tokens)
        rng = random.Random(f"{self.seed}:{run_tag}:{index}")
        text = f"[{run_tag} #{index}]"
        # sentences average ~20 tokens, so this overshoots by about one sentence; the cut trims it
        while len(self.tokens.encode(text)) < body_tokens:
            text += " " + rng.choice(SENTENCES)
        return self.tokens.decode(self.tokens.encode(text)[:body_tokens])


def prompt_len_tolerance(num_tokens: int) -> int:
    """How far the server's count may be from the requested one before the run warns: none
    for bytes in practice, a few tokens where a cut piece re-tokenizes differently."""
    return max(2, num_tokens // 100)
