"""Every generation response the HTTP tests receive is checked against the `openai` package's
own models (`contracts.strict_openai`): raw HTTP calls through `http_helpers`, and
the official client through `ValidatingTransport`, which sees the bytes before the client
parses them (openai-python builds stream chunks without validating them).

`CHECKED` counts the bodies checked per kind, so a test can assert that its responses were.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import openai

from contracts.strict_openai import ResponseKind, parse_strict

try:  # the HTTP library openai-python is built on
    import httpx2 as httpx
except ImportError:  # older openai releases
    import httpx

CHECKED: Counter[ResponseKind] = Counter()
SSE_DATA = b"data: "
SSE_DONE = b"[DONE]"
EVENT_STREAM = "text/event-stream"
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


def is_generation(path: str) -> bool:
    return path.endswith(GENERATION_PATHS)


def check_body(path: str, raw: object, stream: bool) -> None:
    """Refuse (StrictResponseError) a 200 body or event of `path` that the OpenAI models would;
    in-band error events (`{"error": ...}`) are not responses and are left to the test."""
    if isinstance(raw, dict) and "error" in raw:
        return
    kind = ResponseKind.for_endpoint(path, stream)
    parse_strict(raw, kind)
    CHECKED[kind] += 1


class EventStreamChecker:
    """Checks each `data:` event of a server-sent event stream as its bytes arrive."""

    def __init__(self, path: str):
        self.path, self._pending = path, b""

    def feed(self, data: bytes) -> None:
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            payload = line.strip()
            if payload.startswith(SSE_DATA) and payload[len(SSE_DATA) :] != SSE_DONE:
                check_body(self.path, json.loads(payload[len(SSE_DATA) :]), stream=True)


class _CheckedStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, path: str, is_event_stream: bool):
        self.inner, self.path = inner, path
        self.events = EventStreamChecker(path) if is_event_stream else None
        self.body = b""

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            if self.events is not None:
                self.events.feed(chunk)
            else:
                self.body += chunk
            yield chunk
        if self.events is None:
            check_body(self.path, json.loads(self.body), stream=False)

    def close(self) -> None:
        self.inner.close()


class ValidatingTransport(httpx.HTTPTransport):
    """The default transport, checking every 200 answer of a generation endpoint on its way in."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        path = request.url.path
        if response.status_code == 200 and is_generation(path):
            is_event_stream = response.headers.get("content-type", "").startswith(EVENT_STREAM)
            response.stream = _CheckedStream(response.stream, path, is_event_stream)
        return response


def strict_openai_client(base_url: str, timeout: float) -> openai.OpenAI:
    """An official client for `base_url` (ending in /v1) whose responses are all checked."""
    return openai.OpenAI(
        base_url=base_url,
        api_key="unused",
        max_retries=0,
        timeout=timeout,
        http_client=openai.DefaultHttpxClient(transport=ValidatingTransport()),
    )
