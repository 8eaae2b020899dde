"""Turning chat messages into one prompt string.

A model whose tokenizer ships a Jinja chat template (Hugging Face `chat_template`) gets
exactly that template, rendered the way `transformers` renders it: a sandboxed Jinja
environment with `trim_blocks`/`lstrip_blocks`, `messages`, `add_generation_prompt`,
`raise_exception` and `strftime_now`. The special-token variables `bos_token` and
`eos_token` render as the tokenizer's text for them (`<s>`, `<|im_end|>`, ...), as in
`transformers`, or as "" when it has none; encoding the prompt reads that text back as the
special id, and a prompt that starts with the BOS text gets no second BOS.

A tokenizer without a template (the built-in presets' byte tokenizer) gets
`BUILTIN_CHAT_TEMPLATE`, one line per message and an open assistant turn:

    system: You are terse.
    user: Hi!
    assistant:
"""

from __future__ import annotations

import datetime
from typing import Any, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from minipd.api.errors import bad_request
from minipd.api.protocol import ChatMessage
from minipd.models.tokenizers.tokenizer import Tokenizer

BUILTIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message.role }}: {{ message.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


class ChatTemplate:
    """A compiled chat template; `render` is safe to call for untrusted messages."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None):
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        self.source = source
        self.is_builtin = source == BUILTIN_CHAT_TEMPLATE
        self.bos_token, self.eos_token = bos_token or "", eos_token or ""
        self._template = environment.from_string(source)

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> "ChatTemplate":
        """The tokenizer's own template (or the built-in one when it has none), with its
        BOS and EOS text."""
        return cls(tokenizer.chat_template or BUILTIN_CHAT_TEMPLATE, tokenizer.bos_token, tokenizer.eos_token)

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        """The prompt text; a template that refuses the conversation is a 400 on `messages`."""
        plain: list[dict[str, Any]] = [
            {"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in messages
        ]
        try:
            return self._template.render(
                messages=plain,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.TemplateError as exc:
            raise bad_request("messages", f"the chat template refused them: {exc}") from exc
