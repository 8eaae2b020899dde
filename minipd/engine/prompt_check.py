"""Turn a prompt (text or token ids) into validated token ids; shared by the engine and the router.

A text prompt that is certainly too long (its length, by the tokenizer's `max_token_chars`
bound, needs more tokens than max_model_len) is refused before it is tokenized.
"""

from __future__ import annotations

from typing import Sequence

from minipd.engine.sampling_params import MAX_INT, InvalidRequestError
from minipd.models.tokenizers.tokenizer import Tokenizer


def prompt_token_ids(
    tokenizer: Tokenizer, prompt: str | Sequence[int], vocab_size: int, max_model_len: int
) -> list[int]:
    """Raises InvalidRequestError naming `prompt` or `prompt_token_ids`."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt", "must not be empty")
        bound = tokenizer.max_token_chars
        at_least = -(-len(prompt) // bound) if bound else 0
        if at_least >= max_model_len:  # refused without tokenizing (megabytes take seconds)
            raise InvalidRequestError(
                "prompt",
                f"at least {at_least} tokens; max_model_len is {max_model_len} "
                f"(the prompt must leave room for at least one output token)",
            )
        token_ids = tokenizer.encode(prompt)
    else:
        token_ids = list(prompt)
        if not token_ids:
            raise InvalidRequestError("prompt_token_ids", "must not be empty")
        if len(token_ids) < max_model_len:  # a longer one is refused below, without scanning it
            _check_vocabulary(token_ids, vocab_size)
    if len(token_ids) >= max_model_len:
        raise InvalidRequestError(
            "prompt",
            f"{len(token_ids)} tokens; max_model_len is {max_model_len} "
            f"(the prompt must leave room for at least one output token)",
        )
    return token_ids


def _check_vocabulary(token_ids: list, vocab_size: int) -> None:
    bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        shown = [t if isinstance(t, int) and abs(t) <= MAX_INT else "..." for t in bad[:5]]  # no 1000-digit echo
        raise InvalidRequestError("prompt_token_ids", f"ids {shown} outside the vocabulary [0, {vocab_size})")
