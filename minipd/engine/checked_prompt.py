"""A prompt validated once, at the edge that received it, and what travels on from there.

The edges: the HTTP front (minipd/api/serving.py), the router's control port (ClusterClient's
requests), `Router.submit`/`generate` and `Engine.submit`/`generate` for Python callers, each
for what it receives. `check_prompt` is the one full validation: the sampling parameters
(their seed fixed, so every instance samples alike) and the prompt (tokenized if text, its ids
in the vocabulary, its length below max_model_len), naming the bad field. It yields a
`CheckedPrompt`; whoever takes one on (the router from the HTTP front or its control port,
an engine from its instance) runs `check_invariants`, a few cheap checks that keep a model
from being fed what it cannot run, never the full validation again.
"""

from __future__ import annotations

from typing import Sequence

import msgspec

from minipd.engine.sampling_params import MAX_INT, InvalidRequestError, SamplingParams
from minipd.models.tokenizers.tokenizer import Tokenizer


class CheckedPrompt(msgspec.Struct, frozen=True):
    token_ids: list[int]
    params: SamplingParams  # validated, its seed fixed


def check_prompt(
    tokenizer: Tokenizer,
    prompt: str | Sequence[int],
    params: SamplingParams | None,
    vocab_size: int,
    max_model_len: int,
) -> CheckedPrompt:
    """Validate `params` (None: the defaults), then tokenize and validate `prompt`; raises
    InvalidRequestError naming the field."""
    params = (params or SamplingParams()).with_seed()
    params.validate(vocab_size)
    return CheckedPrompt(prompt_token_ids(tokenizer, prompt, vocab_size, max_model_len), params)


def check_invariants(prompt: CheckedPrompt, vocab_size: int, max_model_len: int) -> None:
    """What a receiver of a checked prompt makes sure of, in time linear in C (min/max) and
    without naming single ids: it is not empty, leaves room for an output token, and every
    id, stop ids included, is in its vocabulary. Raises InvalidRequestError."""
    token_ids, params = prompt.token_ids, prompt.params
    if not 0 < len(token_ids) < max_model_len:
        raise InvalidRequestError("prompt", f"{len(token_ids)} tokens; max_model_len is {max_model_len}")
    for field, ids in (("prompt_token_ids", token_ids), ("stop_token_ids", params.stop_token_ids)):
        if ids and not (min(ids) >= 0 and max(ids) < vocab_size):
            raise InvalidRequestError(field, f"ids outside the vocabulary [0, {vocab_size})")
    if params.max_tokens <= 0:
        raise InvalidRequestError("max_tokens", f"must be positive, got {params.max_tokens}")


def accept_prompt(
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | CheckedPrompt,
    params: SamplingParams | None,
    vocab_size: int,
    max_model_len: int,
) -> CheckedPrompt:
    """An edge's entry: a raw prompt is checked in full, a checked one passes the invariants
    (it carries its own sampling parameters, so `params` must be None)."""
    if not isinstance(prompt, CheckedPrompt):
        return check_prompt(tokenizer, prompt, params, vocab_size, max_model_len)
    if params is not None:
        raise TypeError("a CheckedPrompt carries its sampling parameters: pass params=None")
    check_invariants(prompt, vocab_size, max_model_len)
    return prompt


def prompt_token_ids(
    tokenizer: Tokenizer, prompt: str | Sequence[int], vocab_size: int, max_model_len: int
) -> list[int]:
    """A prompt (text or token ids) as validated token ids; raises InvalidRequestError naming
    `prompt` or `prompt_token_ids`."""
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
