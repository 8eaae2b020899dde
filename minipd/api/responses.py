"""The OpenAI API's response bodies, as msgspec Structs: a whole completion or chat completion,
the chunks of a streamed one, the usage counts, and the model list (the requests are
protocol.py's; stream_format.py fills these in).
"""

from __future__ import annotations

import msgspec


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def make_usage(num_prompt_tokens: int, num_output_tokens: int, num_cached_tokens: int) -> Usage:
    return Usage(
        num_prompt_tokens,
        num_output_tokens,
        num_prompt_tokens + num_output_tokens,
        PromptTokensDetails(num_cached_tokens),
    )


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: None = None


# The response bodies carry OpenAI's `object` field as their msgspec tag: a tag is written on
# every encode, so `omit_defaults` (which keeps `usage` out of stream chunks, as OpenAI's own
# streams do without `include_usage`) can never drop it; clients reject bodies without it.


class CompletionResponse(msgspec.Struct, omit_defaults=True, tag_field="object", tag="text_completion"):
    """A whole completion (`text_completion`) or one streamed chunk of it."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatReply(msgspec.Struct):
    content: str
    role: str = "assistant"


class ChatDelta(msgspec.Struct, omit_defaults=True):
    content: str | None = None
    role: str | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatReply
    finish_reason: str | None
    logprobs: None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChatDelta
    finish_reason: str | None
    logprobs: None = None


class ChatCompletionResponse(msgspec.Struct, omit_defaults=True, tag_field="object", tag="chat.completion"):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatCompletionChunk(msgspec.Struct, omit_defaults=True, tag_field="object", tag="chat.completion.chunk"):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(msgspec.Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "minipd"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"
