"""Chat messages to a prompt: the built-in template, a model's Jinja template, and refusals."""

from __future__ import annotations

import msgspec
import pytest

from minipd.api.chat_template import BUILTIN_CHAT_TEMPLATE, ChatTemplate
from minipd.api.errors import ApiError
from minipd.api.protocol import ChatMessage, TextPart
from minipd.models.tokenizers.tokenizer import ByteTokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
STRICT = (
    "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user message') }}"
    "{% endif %}{{ messages[0].content }}"
)

CONVERSATION = [ChatMessage("system", "You are terse."), ChatMessage("user", [TextPart("Hi"), TextPart("there")])]


def test_builtin_template_is_used_without_a_model_template():
    template = ChatTemplate.for_tokenizer(ByteTokenizer())
    assert template.is_builtin and template.source == BUILTIN_CHAT_TEMPLATE
    assert template.render(CONVERSATION) == "system: You are terse.\nuser: Hi\nthere\nassistant:"


def test_the_model_template_is_rendered_when_the_tokenizer_has_one():
    tokenizer = ByteTokenizer()
    tokenizer.chat_template = CHATML
    template = ChatTemplate.for_tokenizer(tokenizer)
    assert not template.is_builtin
    assert template.render(CONVERSATION) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n"
    )


def test_special_token_variables_render_empty_without_token_text():
    tokenizer = ByteTokenizer()  # its BOS and EOS are ids with no text
    tokenizer.chat_template = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
    assert ChatTemplate.for_tokenizer(tokenizer).render(CONVERSATION) == "You are terse."


def test_special_token_variables_render_as_the_given_text():
    template = ChatTemplate(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}", bos_token="<s>", eos_token="</s>"
    )
    assert template.render(CONVERSATION) == "<s>You are terse.</s>"


def test_a_template_refusing_the_conversation_is_a_400_on_messages():
    with pytest.raises(ApiError) as info:
        ChatTemplate(STRICT).render(CONVERSATION)
    assert info.value.status == 400 and info.value.param == "messages"
    assert "must start with a user message" in info.value.message


def test_templates_run_sandboxed():
    with pytest.raises(ApiError) as info:
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render(CONVERSATION)
    assert info.value.param == "messages"


def test_messages_decode_from_openai_json():
    raw = b'[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]'
    (message,) = msgspec.json.decode(raw, type=list[ChatMessage])
    assert message.text() == "a\nb"
