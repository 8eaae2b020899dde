"""Run one workload against one or more OpenAI endpoints and record every request.

One run, top-down:
1. ask the first endpoint which model it serves (`/v1/models`);
2. warm up: `num_warmup` requests per endpoint, one at a time, shaped like the workload's
   first request and left out of the results; the first one also measures how many special
   tokens the server adds to a prompt (its `usage.prompt_tokens` minus the prompt's own);
3. build every prompt before the clock starts, so prompt building never delays a request;
4. send each request at its arrival offset (or keep `concurrency` in flight), endpoints in
   turn (round robin), with a progress bar;
5. wait for all, and check that the server counted each prompt as the requested length.
A `RunObserver` in the config hears of every request as it is sent and as it ends (a live
view of the run); cancelling the run cancels the requests in flight (their connections close,
which aborts them on the server).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import NamedTuple, Protocol, Sequence

import aiohttp
import msgspec

from minipd.ops.loadgen.client import ChunkParser, send_completion, served_model, typed_chunk
from minipd.ops.loadgen.prompts import PromptBuilder, prompt_len_tolerance
from minipd.ops.loadgen.records import RequestRecord
from minipd.ops.workload import RequestSpec

DEFAULT_REQUEST_TIMEOUT_S = 600.0
WARMUP_TAG = "warmup"


class RunObserver(Protocol):
    """Told of each measured request (warm-up requests are not), on the runner's event loop."""

    def sent(self, record: RequestRecord) -> None: ...

    def done(self, record: RequestRecord) -> None: ...


class RunnerConfig(msgspec.Struct, frozen=True, kw_only=True):
    num_warmup: int = 1  # per endpoint
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    progress: bool = True
    concurrency: int | None = None  # keep this many in flight instead of following arrival times
    max_foreign_cpu: float | None = None  # repeat a run during which other jobs took more (host_load.QuietGuard)
    quiet_wait_s: float = 600.0
    max_reruns: int = 3
    parse_chunk: ChunkParser = typed_chunk  # how each streamed event is parsed (client.py)
    headers: dict[str, str] = {}  # sent with every request (an Authorization header)
    observer: RunObserver | None = None


class RunResult(NamedTuple):
    records: list[RequestRecord]
    duration_s: float  # from the first send to the last request's end
    model: str
    special_tokens: int  # tokens the server adds to every prompt
    num_prompt_len_mismatches: int  # successful requests whose prompt the server counted otherwise
    # time.perf_counter() at the run's start, where arrival_s counts from: the clock of the
    # instances' step logs (engine/step_log.py; CLOCK_MONOTONIC, system-wide on Linux), to
    # line their steps up with the run
    started_clock_s: float = 0.0


class WarmupFailed(RuntimeError):
    """The endpoint did not answer a warm-up request: measuring it would only record failures."""


async def _warm_up(
    session: aiohttp.ClientSession,
    urls: Sequence[str],
    model: str,
    builder: PromptBuilder,
    first: RequestSpec,
    config: RunnerConfig,
    run_tag: str,
) -> int:
    """Returns the special tokens the server adds (measured on the first warm-up request)."""
    special_tokens = builder.special_tokens
    for n, url in enumerate(u for u in urls for _ in range(max(1, config.num_warmup))):
        prompt = first.prompt or builder.prompt(f"{run_tag}-{WARMUP_TAG}", n, first.prompt_len)
        record = RequestRecord(
            index=-1, scheduled_s=0.0, sent_s=0.0, url=url, prompt_len=first.prompt_len, output_len=first.output_len
        )
        await send_completion(session, record, model, prompt, config.request_timeout_s, config.parse_chunk)
        if not record.success:
            raise WarmupFailed(f"warm-up request to {url} failed: {record.error}")
        if n == 0 and record.usage_reported:
            special_tokens = record.prompt_tokens - len(builder.tokens.encode(prompt))
    return special_tokens


def _prompts(specs: Sequence[RequestSpec], builder: PromptBuilder, run_tag: str) -> list[tuple[str, int]]:
    """(prompt, prompt tokens the server should count) per request."""
    return [
        (spec.prompt, builder.count(spec.prompt))
        if spec.prompt is not None
        else (builder.prompt(run_tag, i, spec.prompt_len), spec.prompt_len)
        for i, spec in enumerate(specs)
    ]


async def run_workload(
    urls: Sequence[str],
    specs: Sequence[RequestSpec],
    builder: PromptBuilder,
    run_tag: str,
    config: RunnerConfig = RunnerConfig(),
) -> RunResult:
    """`run_tag` must differ between runs against one server, so that no prompt repeats."""
    if not urls:
        raise ValueError("run_workload: no endpoint to send to")
    if not specs:
        raise ValueError("run_workload: the workload has no requests")
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=config.headers) as session:
        model = await served_model(session, urls[0])
        builder.special_tokens = await _warm_up(session, urls, model, builder, specs[0], config, run_tag)
        # off the loop: tokenizing thousands of prompts would stall a server sharing it
        prompts = await asyncio.to_thread(_prompts, specs, builder, run_tag)
        observer = config.observer
        progress = _progress_bar(len(specs), run_tag, config.progress)
        limit = asyncio.Semaphore(config.concurrency) if config.concurrency else None
        start = time.perf_counter()

        async def one(i: int, spec: RequestSpec) -> RequestRecord:
            if limit is not None:
                await limit.acquire()
            try:
                prompt, prompt_len = prompts[i]
                record = RequestRecord(
                    index=i,
                    scheduled_s=spec.arrival_s,
                    sent_s=time.perf_counter() - start,
                    url=urls[i % len(urls)],
                    prompt_len=prompt_len,
                    output_len=spec.output_len,
                )
                if observer is not None:
                    observer.sent(record)
                await send_completion(session, record, model, prompt, config.request_timeout_s, config.parse_chunk)
                if observer is not None:
                    observer.done(record)
                return record
            finally:
                if limit is not None:
                    limit.release()
                if progress is not None:
                    progress.update(1)

        tasks = []
        try:
            for i, spec in enumerate(specs):
                if limit is None:
                    delay = start + spec.arrival_s - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)  # pacing arrivals, not synchronisation
                tasks.append(asyncio.ensure_future(one(i, spec)))
            records = list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            if progress is not None:
                progress.close()
        duration = time.perf_counter() - start
    mismatches = sum(
        1
        for r in records
        if r.success and r.usage_reported and abs(r.prompt_tokens - r.prompt_len) > prompt_len_tolerance(r.prompt_len)
    )
    return RunResult(records, duration, model, builder.special_tokens, mismatches, start)


def _progress_bar(total: int, label: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bench extra brings tqdm; without it, run quietly
        return None
    return tqdm(total=total, desc=label, unit="req", leave=False, file=sys.stderr, dynamic_ncols=True)
