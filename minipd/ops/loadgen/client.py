"""The load client: one streamed `/v1/completions` request, timed as `vllm bench serve` times it.

The request asks for exactly `output_len` tokens (`max_tokens`, `ignore_eos: true`), greedy
(`temperature: 0`), streamed with the usage in a last chunk (`stream_options.include_usage`),
so it works against any OpenAI-compatible server that honours those vLLM-style fields.
Every event is parsed by `parse_chunk`: by default into `StreamChunk` (the fields the client
reads, typed); the benchmarks pass the strict check against the `openai` package's models
(`contracts/strict_openai.py`), so a server answering with bodies an OpenAI client may refuse
fails its requests, loudly. A body the parser refuses fails its request as "response refused".

A request fails (and is recorded with its error, never raised) on a non-200 status, an
in-band error event, a body the models refuse, a stream without any token, a timeout or a
connection error.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

import aiohttp
import msgspec

from minipd.ops.loadgen.records import RequestRecord

SSE_DATA = b"data:"
SSE_DONE = b"[DONE]"
MAX_ERROR_CHARS = 300


class StreamUsage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int


class StreamChunk(msgspec.Struct):
    """What the client reads of one `data:` event (other fields are ignored)."""

    choices: list[Any]
    usage: StreamUsage | None = None


ChunkParser = Callable[[Any], Any]  # raw JSON -> an object with `.choices` and `.usage`; ValueError if refused


def typed_chunk(raw: Any) -> StreamChunk:
    """The default parser: the event's `choices` and `usage`, typed (msgspec.ValidationError, a
    ValueError, if they are missing or mistyped)."""
    return msgspec.convert(raw, StreamChunk)


def completion_body(model: str, prompt: str, output_len: int) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


async def served_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model id the server lists on /v1/models (as vLLM's client picks it)."""
    async with session.get(f"{base_url}/v1/models") as response:
        response.raise_for_status()
        data = await response.json()
    models = data.get("data") if isinstance(data, dict) else None
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    return models[0]["id"]


def _error_text(status: int, body: bytes) -> str:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode(errors="replace")
    return f"HTTP {status}: {message}"[:MAX_ERROR_CHARS]


async def send_completion(
    session: aiohttp.ClientSession,
    record: RequestRecord,
    model: str,
    prompt: str,
    timeout_s: float,
    parse_chunk: ChunkParser = typed_chunk,
) -> RequestRecord:
    """Send one streamed completion and fill `record`'s measurements in (and return it)."""
    start = time.perf_counter()
    try:
        await asyncio.wait_for(_stream(session, record, model, prompt, start, parse_chunk), timeout_s)
    except asyncio.TimeoutError:
        record.error = f"timed out after {timeout_s:g} s"
    except (aiohttp.ClientError, ConnectionError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    record.success = record.error is None
    return record


async def _stream(
    session: aiohttp.ClientSession,
    record: RequestRecord,
    model: str,
    prompt: str,
    start: float,
    parse_chunk: ChunkParser,
) -> None:
    body = completion_body(model, prompt, record.output_len)
    async with session.post(f"{record.url}/v1/completions", json=body) as response:
        if response.status != 200:
            record.error = _error_text(response.status, await response.read())
            return
        last_event = None
        num_events = 0
        async for line in response.content:  # aiohttp splits the stream at newlines
            line = line.strip()
            if not line.startswith(SSE_DATA):
                continue
            payload = line[len(SSE_DATA) :].strip()
            if payload == SSE_DONE:
                break
            raw = json.loads(payload)
            if isinstance(raw, dict) and "error" in raw:
                record.error = f"error event: {raw['error'].get('message', raw['error'])}"[:MAX_ERROR_CHARS]
                return
            try:
                chunk = parse_chunk(raw)
            except ValueError as exc:
                record.error = f"response refused: {exc}"[:MAX_ERROR_CHARS]
                return
            now = time.perf_counter()
            if chunk.choices:
                if last_event is None:
                    record.ttft_s = now - start
                else:
                    record.itl_s.append(now - last_event)
                last_event = now
                num_events += 1
            if chunk.usage is not None:
                record.prompt_tokens = chunk.usage.prompt_tokens
                record.output_tokens = chunk.usage.completion_tokens
                record.usage_reported = True
        if last_event is None:
            record.error = "the stream carried no token"
            return
        record.e2el_s = last_event - start
        if not record.usage_reported:
            record.output_tokens = num_events  # a server without include_usage: one token per event
