"""The OpenAI API's request and response bodies, as msgspec Structs.

Requests forbid unknown fields: a sampling option that is silently ignored produces
wrong output without any sign, so `{"best_off": 2}` is a 400 naming `best_off`. Known
OpenAI fields that minipd does not implement are accepted only at their neutral value
(`UNSUPPORTED_AT_DEFAULT`). Extensions beyond OpenAI (as vLLM has them): `top_k` and
`ignore_eos`. Chat messages forbid unknown keys too: `tool_calls`, `tool_call_id`,
`function_call`, `refusal` and `audio` name things minipd cannot honour, so they are refused
naming the key (`messages[0].tool_calls`) rather than dropped.

Every integer is bounded to a signed 64 bits (`Int`): the router ships requests to its
instances as msgpack, which holds no more, and a bigger number is a 400 naming its field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from minipd.api.errors import bad_request
from minipd.engine.sampling_params import MAX_INT, SamplingParams

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0

# field -> the neutral value, the only one (besides null) accepted for a known OpenAI
# option that minipd does not implement
UNSUPPORTED_AT_DEFAULT: dict[str, Any] = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logprobs": False,
    "top_logprobs": 0,
    "logit_bias": {},
    "echo": False,
    "best_of": 1,
    "suffix": "",
}


Int = Annotated[int, msgspec.Meta(ge=-MAX_INT - 1, le=MAX_INT)]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


class GenerationRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Fields shared by completions and chat completions."""

    model: str | None = None  # None: the served model
    max_tokens: Int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int | None = None  # extension; None or 0 disables
    seed: Int | None = None
    stop: str | list[str] | None = None
    n: Int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # extension
    user: str | None = None  # accepted and ignored, as OpenAI only logs it
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None

    def check_supported(self) -> None:
        """Raise a 400 naming the first option minipd cannot honour."""
        if self.n != 1:
            raise bad_request("n", f"only n=1 is supported, got {self.n}")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options", "only allowed when stream is true")
        for field, neutral in UNSUPPORTED_AT_DEFAULT.items():
            value = getattr(self, field, None)
            if value is not None and value != neutral:
                raise bad_request(field, f"not supported by minipd (got {value!r})")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters; value checks are left to `SamplingParams.validate`."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
            top_p=DEFAULT_TOP_P if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            stop=stop,
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(GenerationRequest, kw_only=True):
    prompt: str | list[Int]  # text, or token ids
    echo: bool = False
    best_of: Int | None = None
    suffix: str | None = None
    logprobs: Int | None = None

    def sampling_params_for(self, max_model_len: int) -> SamplingParams:
        return self.sampling_params(DEFAULT_COMPLETION_MAX_TOKENS if self.max_tokens is None else self.max_tokens)


class TextPart(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str


class ChatMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(GenerationRequest, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: Int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool | None = None
    top_logprobs: Int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if not self.messages:
            raise bad_request("messages", "must contain at least one message")

    def sampling_params_for(self, max_model_len: int) -> SamplingParams:
        """Without a limit, a chat reply may run to the end of the context."""
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.sampling_params(max_model_len if limit is None else limit)


# ---- responses -------------------------------------------------------------------------


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
