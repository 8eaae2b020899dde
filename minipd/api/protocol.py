"""The OpenAI API's request bodies, as msgspec Structs, and what they ask of the engine (their
sampling parameters); the response bodies are responses.py's.

Requests forbid unknown fields: a sampling option that is silently ignored produces
wrong output without any sign, so `{"best_off": 2}` is a 400 naming `best_off`. Known
OpenAI fields that minipd does not implement are accepted only at their neutral value
(`UNSUPPORTED_AT_DEFAULT`), and so are vLLM's extensions that load clients send at their
neutral values (`repetition_penalty: 1.0`, `min_p: 0`, `skip_special_tokens: true`, ...).
vLLM's extensions honoured: `top_k` (-1 disables, as in vLLM), `ignore_eos`,
`stop_token_ids`, `stream_options.continuous_usage_stats`, and `min_tokens` (EOS, stop tokens
and stop strings are held back until that many tokens are out, as in vLLM). Chat messages
forbid unknown keys too: `tool_calls`, `tool_call_id`, `function_call`, `refusal` and `audio`
name things minipd cannot honour, so they are refused naming the key (`messages[0].tool_calls`)
rather than dropped.

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
    # vLLM's extensions, which load clients send at their neutral values (`vllm bench serve`
    # sends repetition_penalty 1.0)
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "use_beam_search": False,
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,  # minipd's text never holds special tokens
    "spaces_between_special_tokens": True,  # so none are spaced either
}
TOP_K_DISABLED = -1  # vLLM's way of saying no top-k cut (minipd's: 0 or null)


Int = Annotated[int, msgspec.Meta(ge=-MAX_INT - 1, le=MAX_INT)]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False  # a last chunk, without choices, with the request's usage
    # vLLM's: with include_usage, every chunk carries the usage so far (without it, none does,
    # as in vLLM)
    continuous_usage_stats: bool = False


class GenerationRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Fields shared by completions and chat completions."""

    model: str | None = None  # None: the served model
    max_tokens: Int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int | None = None  # extension; None, 0 or -1 disables
    seed: Int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = None  # extension
    min_tokens: Int = 0  # extension; no stop before this many output tokens
    n: Int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # extension
    user: str | None = None  # accepted and ignored, as OpenAI only logs it
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    use_beam_search: bool | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None

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
        self._check_min_tokens()

    def _check_min_tokens(self) -> None:
        """`min_tokens` must be >= 0 and within the request's own output limit (a chat request
        without max_tokens is checked against the context's end by the engine)."""
        if self.min_tokens == 0:
            return
        if self.min_tokens < 0:
            raise bad_request("min_tokens", f"must be >= 0, got {self.min_tokens}")
        limit = self.output_limit()
        if limit is not None and self.min_tokens > limit:
            raise bad_request("min_tokens", f"{self.min_tokens} is above the output limit {limit}")

    def output_limit(self) -> int | None:
        """The request's own limit on output tokens, if it sets one."""
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters; value checks are left to `SamplingParams.validate`."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
            top_p=DEFAULT_TOP_P if self.top_p is None else self.top_p,
            top_k=0 if self.top_k in (None, TOP_K_DISABLED) else self.top_k,
            seed=self.seed,
            stop=stop,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
        )


class CompletionRequest(GenerationRequest, kw_only=True):
    prompt: str | list[Int]  # text, or token ids
    echo: bool = False
    best_of: Int | None = None
    suffix: str | None = None
    logprobs: Int | None = None

    def output_limit(self) -> int:
        return DEFAULT_COMPLETION_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    def sampling_params_for(self, max_model_len: int) -> SamplingParams:
        return self.sampling_params(self.output_limit())


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

    add_generation_prompt: bool = True  # vLLM's; minipd's templates always add it
    continue_final_message: bool = False  # vLLM's; not supported

    def check_supported(self) -> None:
        super().check_supported()
        if not self.messages:
            raise bad_request("messages", "must contain at least one message")
        if not self.add_generation_prompt:
            raise bad_request("add_generation_prompt", "not supported by minipd (got False)")
        if self.continue_final_message:
            raise bad_request("continue_final_message", "not supported by minipd (got True)")

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def sampling_params_for(self, max_model_len: int) -> SamplingParams:
        """Without a limit, a chat reply may run to the end of the context."""
        limit = self.output_limit()
        return self.sampling_params(max_model_len if limit is None else limit)
