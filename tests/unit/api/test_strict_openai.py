"""Strict response parsing against the `openai` package's models, and minipd's bodies passing it."""

from __future__ import annotations

import copy
import json

import msgspec
import pytest

from contracts.openai_contract import EventStreamChecker
from contracts.strict_openai import ResponseKind, StrictResponseError, missing_required, parse_strict
from minipd.api.responses import make_usage
from minipd.api.stream_format import ChatFormat, CompletionFormat

USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
BODIES = {
    ResponseKind.COMPLETION: {
        "id": "c",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "usage": USAGE,
        "choices": [{"index": 0, "text": "hi", "finish_reason": "length", "logprobs": None}],
    },
    ResponseKind.COMPLETION_CHUNK: {
        "id": "c",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": "h", "finish_reason": None}],
    },
    ResponseKind.CHAT_COMPLETION: {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "usage": USAGE,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
    },
    ResponseKind.CHAT_COMPLETION_CHUNK: {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "h"}, "finish_reason": None}],
    },
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_complete_bodies_parse(kind):
    parsed = parse_strict(BODIES[kind], kind)
    assert parsed.id == "c" and parsed.choices[0].index == 0


@pytest.mark.parametrize("kind", list(BODIES))
def test_a_body_without_object_is_refused(kind):
    body = {k: v for k, v in BODIES[kind].items() if k != "object"}
    with pytest.raises(StrictResponseError) as info:
        parse_strict(body, kind)
    assert info.value.path == "object" and "required" in str(info.value)


@pytest.mark.parametrize(
    "kind, drop, path",
    [
        (ResponseKind.COMPLETION_CHUNK, ("choices", 0, "finish_reason"), "choices[0].finish_reason"),
        (ResponseKind.COMPLETION, ("choices", 0, "text"), "choices[0].text"),
        (ResponseKind.COMPLETION, ("usage", "total_tokens"), "usage.total_tokens"),
        (ResponseKind.CHAT_COMPLETION, ("choices", 0, "message", "role"), "choices[0].message.role"),
        (ResponseKind.CHAT_COMPLETION_CHUNK, ("choices", 0, "delta"), "choices[0].delta"),
        (ResponseKind.CHAT_COMPLETION_CHUNK, ("created",), "created"),
    ],
)
def test_missing_nested_required_fields_are_named(kind, drop, path):
    body = copy.deepcopy(BODIES[kind])
    holder = body
    for key in drop[:-1]:
        holder = holder[key]
    del holder[drop[-1]]
    assert missing_required(body, kind.value) == [path]
    with pytest.raises(StrictResponseError) as info:
        parse_strict(body, kind)
    assert info.value.path == path


@pytest.mark.parametrize(
    "kind, field, value, path",
    [
        (ResponseKind.COMPLETION, "object", "chat.completion", "object"),  # the wrong kind of body
        (ResponseKind.CHAT_COMPLETION_CHUNK, "object", "chat.completion", "object"),
        (ResponseKind.COMPLETION, "created", "yesterday", "created"),
    ],
)
def test_wrong_values_are_refused(kind, field, value, path):
    with pytest.raises(StrictResponseError) as info:
        parse_strict({**BODIES[kind], field: value}, kind)
    assert info.value.path == path


def test_only_stream_chunks_may_leave_finish_reason_null():
    chunk = BODIES[ResponseKind.COMPLETION_CHUNK]
    assert parse_strict(chunk, ResponseKind.COMPLETION_CHUNK).choices[0].finish_reason is None
    with pytest.raises(StrictResponseError) as info:
        parse_strict(chunk, ResponseKind.COMPLETION)
    assert info.value.path == "choices[0].finish_reason"


def test_usage_may_be_absent_or_null_in_chunks():
    chunk = BODIES[ResponseKind.CHAT_COMPLETION_CHUNK]
    assert parse_strict(chunk, ResponseKind.CHAT_COMPLETION_CHUNK).usage is None
    assert parse_strict({**chunk, "usage": None}, ResponseKind.CHAT_COMPLETION_CHUNK).usage is None


def _encoded(struct) -> dict:
    return json.loads(msgspec.json.encode(struct))


def test_every_body_minipd_writes_passes():
    usage = make_usage(4, 2, 0)
    completion, chat = CompletionFormat("cmpl-1", "tiny"), ChatFormat("chatcmpl-1", "tiny")
    bodies = [
        (completion.whole("ab", "length", usage), ResponseKind.COMPLETION),
        (completion.chunk("a", None), ResponseKind.COMPLETION_CHUNK),
        (completion.chunk("b", "stop"), ResponseKind.COMPLETION_CHUNK),
        (completion.usage_chunk(usage), ResponseKind.COMPLETION_CHUNK),
        (chat.whole("ab", "stop", usage), ResponseKind.CHAT_COMPLETION),
        *((c, ResponseKind.CHAT_COMPLETION_CHUNK) for c in chat.opening()),
        (chat.chunk("a", None), ResponseKind.CHAT_COMPLETION_CHUNK),
        (chat.chunk("", "length"), ResponseKind.CHAT_COMPLETION_CHUNK),
        (chat.usage_chunk(usage), ResponseKind.CHAT_COMPLETION_CHUNK),
    ]
    for struct, kind in bodies:
        raw = _encoded(struct)
        assert raw["object"] == kind.value.model_fields["object"].annotation.__args__[0]
        parse_strict(raw, kind)
    assert "usage" not in _encoded(completion.chunk("a", None))  # as OpenAI streams without include_usage


def test_the_event_stream_checker_refuses_a_chunk_without_object():
    checker = EventStreamChecker("/v1/chat/completions")
    good = json.dumps(BODIES[ResponseKind.CHAT_COMPLETION_CHUNK]).encode()
    checker.feed(b"data: " + good[:10])  # events may arrive split across reads
    checker.feed(good[10:] + b"\n\n")
    bad = {k: v for k, v in BODIES[ResponseKind.CHAT_COMPLETION_CHUNK].items() if k != "object"}
    with pytest.raises(StrictResponseError):
        checker.feed(b"data: " + json.dumps(bad).encode() + b"\n\ndata: [DONE]\n\n")
