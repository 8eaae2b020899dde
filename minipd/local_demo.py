"""`minipd --role both` without a network front: answer prompts and print tokens, TTFT and ITL.

Prompts come from `--prompt` flags (all submitted at once, so they batch together) or, without
any, one per line from standard input.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import TextIO

import msgspec

from .engine import Engine
from .sampling_params import InvalidRequestError, SamplingParams

MS = 1e3


class RequestTiming(msgspec.Struct):
    ttft_s: float
    itl_s: list[float]


async def run_one(engine: Engine, prompt: str, params: SamplingParams) -> tuple[str, list[int], RequestTiming, str]:
    start = time.perf_counter()
    token_times: list[float] = []
    token_ids: list[int] = []
    text, reason = [], ""
    async for out in engine.generate(prompt, params):
        now = time.perf_counter()
        token_times.extend([now] * len(out.token_ids))
        token_ids.extend(out.token_ids)
        text.append(out.text)
        reason = out.finish_reason or reason
    ttft = token_times[0] - start if token_times else float("nan")
    itl = [b - a for a, b in zip(token_times, token_times[1:])]
    return "".join(text), token_ids, RequestTiming(ttft, itl), reason


def format_result(prompt: str, text: str, token_ids: list[int], timing: RequestTiming, reason: str) -> str:
    itl_ms = [x * MS for x in timing.itl_s]
    itl = (f"ITL mean {statistics.fmean(itl_ms):.1f} ms, p50 {statistics.median(itl_ms):.1f} ms, "
           f"max {max(itl_ms):.1f} ms" if itl_ms else "ITL n/a")
    return (f"prompt: {prompt!r}\n  output ({len(token_ids)} tokens, finish={reason}): {text!r}\n"
            f"  token ids: {token_ids}\n  TTFT {timing.ttft_s * MS:.1f} ms, {itl}")


async def run_demo(engine: Engine, prompts: list[str], params: SamplingParams, out: TextIO = sys.stdout) -> int:
    async with engine:
        if prompts:
            results = await asyncio.gather(*(run_one(engine, p, params) for p in prompts), return_exceptions=True)
            status = 0
            for prompt, result in zip(prompts, results):
                if isinstance(result, InvalidRequestError):
                    print(f"prompt: {prompt!r}\n  error: {result}", file=out)
                    status = 2
                elif isinstance(result, BaseException):
                    raise result
                else:
                    print(format_result(prompt, *result), file=out)
            return status
        for line in sys.stdin:
            prompt = line.rstrip("\n")
            try:
                print(format_result(prompt, *(await run_one(engine, prompt, params))), file=out, flush=True)
            except InvalidRequestError as exc:
                print(f"error: {exc}", file=out, flush=True)
    return 0
