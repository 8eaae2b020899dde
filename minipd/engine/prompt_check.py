"""Turn a prompt (text or token ids) into validated token ids; shared by the engine and the router."""

from __future__ import annotations

from typing import Sequence

from minipd.models.tokenizer import Tokenizer

from minipd.engine.sampling_params import MAX_INT, InvalidRequestError


def prompt_token_ids(tokenizer: Tokenizer, prompt: str | Sequence[int], vocab_size: int,
                     max_model_len: int) -> list[int]:
    """Raises InvalidRequestError naming `prompt` or `prompt_token_ids`."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt", "must not be empty")
        token_ids = tokenizer.encode(prompt)
    else:
        token_ids = list(prompt)
        if not token_ids:
            raise InvalidRequestError("prompt_token_ids", "must not be empty")
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            shown = [t if isinstance(t, int) and abs(t) <= MAX_INT else "..." for t in bad[:5]]  # no 1000-digit echo
            raise InvalidRequestError("prompt_token_ids", f"ids {shown} outside the vocabulary [0, {vocab_size})")
    if len(token_ids) >= max_model_len:
        raise InvalidRequestError("prompt", f"{len(token_ids)} tokens; max_model_len is {max_model_len} "
                                            f"(the prompt must leave room for at least one output token)")
    return token_ids
