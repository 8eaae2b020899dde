"""Timed single requests for the crossover: a probe prompt's TTFT, and a decode stream running
beside probes whose every token arrival is kept.

`DecodeStream` runs one long streamed completion in the background and timestamps each event
(`times`, `time.perf_counter`); leaving its `async with` closes the connection, which aborts
the request on the server. `probe_ttft` sends one prompt for a single token and returns the
(send, first token) times.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from contracts.strict_openai import ResponseKind, parse_strict, strict_completion_chunk
from minipd.ops.loadgen.client import SSE_DATA, SSE_DONE, completion_body, send_completion
from minipd.ops.loadgen.prompts import PromptBuilder
from minipd.ops.loadgen.records import RequestRecord

STREAM_START_TIMEOUT_S = 120.0


class DecodeStream:
    def __init__(self, session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int):
        self.session, self.url, self.model, self.prompt, self.max_tokens = session, url, model, prompt, max_tokens
        self.times: list[float] = []
        self._new_event = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "DecodeStream":
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        body = completion_body(self.model, self.prompt, self.max_tokens)
        async with self.session.post(f"{self.url}/v1/completions", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"decode stream: HTTP {response.status}: {(await response.read())[:300]!r}")
            async for line in response.content:
                line = line.strip()
                if not line.startswith(SSE_DATA) or line[len(SSE_DATA) :].strip() == SSE_DONE:
                    continue
                if parse_strict(json.loads(line[len(SSE_DATA) :]), ResponseKind.COMPLETION_CHUNK).choices:
                    self.times.append(time.perf_counter())
                    self._new_event.set()

    async def wait_for_tokens(self, count: int, timeout_s: float = STREAM_START_TIMEOUT_S) -> None:
        """Until the stream has produced `count` more events; RuntimeError if it ended first."""
        target = len(self.times) + count
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(self.times) < target:
            if self._task.done():
                error = self._task.exception() if not self._task.cancelled() else None
                raise RuntimeError(
                    f"the decode stream ended after {len(self.times)} tokens"
                    + (f": {error}" if error else "; raise --background-tokens")
                )
            self._new_event.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise RuntimeError(f"the decode stream produced no token for {timeout_s:g} s")
            try:
                await asyncio.wait_for(self._new_event.wait(), min(remaining, 1.0))
            except asyncio.TimeoutError:
                pass  # check the task's state again

    @property
    def finished(self) -> bool:
        return self._task is not None and self._task.done()


async def probe_ttft(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, prompt_len: int, timeout_s: float
) -> tuple[float, float]:
    """(send time, first token time) of a one-token completion; RuntimeError if it fails."""
    record = RequestRecord(index=0, scheduled_s=0.0, sent_s=0.0, url=url, prompt_len=prompt_len, output_len=1)
    start = time.perf_counter()
    await send_completion(session, record, model, prompt, timeout_s, strict_completion_chunk)
    if not record.success:
        raise RuntimeError(f"probe of {prompt_len} tokens failed: {record.error}")
    return start, start + record.ttft_s


async def warm_up_and_calibrate(
    session: aiohttp.ClientSession, url: str, model: str, builder: PromptBuilder, prompt_len: int, timeout_s: float
) -> None:
    """One unmeasured request; sets `builder.special_tokens` from the server's prompt count."""
    prompt = builder.prompt("warmup", 0, prompt_len)
    record = RequestRecord(index=-1, scheduled_s=0.0, sent_s=0.0, url=url, prompt_len=prompt_len, output_len=1)
    await send_completion(session, record, model, prompt, timeout_s, strict_completion_chunk)
    if not record.success:
        raise RuntimeError(f"warm-up request to {url} failed: {record.error}")
    if record.usage_reported:
        builder.special_tokens = record.prompt_tokens - len(builder.tokens.encode(prompt))
