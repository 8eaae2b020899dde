"""Response bodies and stream chunks of the two generation endpoints, from engine increments.

`CompletionFormat` writes `text_completion` objects, `ChatFormat` `chat.completion` objects and
`chat.completion.chunk`s. A chunk carries `usage` only when asked: in a last chunk without
choices with `stream_options.include_usage`, and with vLLM's `continuous_usage_stats` besides
on every chunk (the counts so far); otherwise it has no `usage` key, as OpenAI's streams have
none.
"""

from __future__ import annotations

import time

from minipd.api.responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatReply,
    CompletionChoice,
    CompletionResponse,
    Usage,
)


class CompletionFormat:
    """Shapes engine increments into `text_completion` objects."""

    def __init__(self, request_id: str, model: str):
        self.request_id, self.model, self.created = request_id, model, int(time.time())

    def opening(self, usage: Usage | None = None) -> list[CompletionResponse]:
        return []

    def chunk(self, text: str, finish_reason: str | None, usage: Usage | None = None) -> CompletionResponse:
        return self.whole(text, finish_reason, usage)

    def usage_chunk(self, usage: Usage) -> CompletionResponse:
        return CompletionResponse(self.request_id, self.created, self.model, [], usage=usage)

    def whole(self, text: str, finish_reason: str | None, usage: Usage | None) -> CompletionResponse:
        return CompletionResponse(
            self.request_id, self.created, self.model, [CompletionChoice(0, text, finish_reason)], usage=usage
        )


class ChatFormat:
    """Shapes engine increments into `chat.completion` objects and chunks."""

    def __init__(self, request_id: str, model: str):
        self.request_id, self.model, self.created = request_id, model, int(time.time())

    def opening(self, usage: Usage | None = None) -> list[ChatCompletionChunk]:
        return [self._chunk(ChatDelta(content="", role="assistant"), None, usage)]

    def chunk(self, text: str, finish_reason: str | None, usage: Usage | None = None) -> ChatCompletionChunk:
        return self._chunk(ChatDelta(content=text), finish_reason, usage)

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(self.request_id, self.created, self.model, [], usage=usage)

    def whole(self, text: str, finish_reason: str | None, usage: Usage | None) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            self.request_id, self.created, self.model, [ChatChoice(0, ChatReply(text), finish_reason)], usage=usage
        )

    def _chunk(self, delta: ChatDelta, finish_reason: str | None, usage: Usage | None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            self.request_id, self.created, self.model, [ChatChunkChoice(0, delta, finish_reason)], usage=usage
        )
