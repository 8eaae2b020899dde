"""`minipd --role both` without a network front: answer prompts and print tokens, TTFT and ITL.

Prompts come from `--prompt` flags (all submitted at once, so they batch together) or, without
any, one per line from standard input; with `--chat` each is sent as a user message through the
model's chat template (what an instruct model such as `smollm2` expects).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Callable, TextIO

import msgspec

from minipd.api.chat_template import ChatTemplate
from minipd.api.protocol import ChatMessage
from minipd.engine.engine import Engine
from minipd.engine.request import TransferInfo
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams
from minipd.entrypoints.config_sections import DemoConfig
from minipd.models.tokenizers.tokenizer import Tokenizer

MS = 1e3


class RequestTiming(msgspec.Struct):
    ttft_s: float
    itl_s: list[float]


class DemoResult(msgspec.Struct):
    text: str
    token_ids: list[int]
    timing: RequestTiming
    finish_reason: str
    error: str | None = None
    transfer: TransferInfo | None = None


async def run_one(server, prompt: str, params: SamplingParams) -> DemoResult:
    """Run one prompt through anything with `generate()` (an Engine, a cluster, a client)."""
    start = time.perf_counter()
    token_times: list[float] = []
    token_ids: list[int] = []
    text, reason, error, transfer = [], "", None, None
    async for out in server.generate(prompt, params):
        now = time.perf_counter()
        token_times.extend([now] * len(out.token_ids))
        token_ids.extend(out.token_ids)
        text.append(out.text)
        reason = out.finish_reason or reason
        error = out.error or error
        transfer = out.transfer or transfer
    ttft = token_times[0] - start if token_times else float("nan")
    itl = [b - a for a, b in zip(token_times, token_times[1:])]
    return DemoResult("".join(text), token_ids, RequestTiming(ttft, itl), reason, error, transfer)


def format_result(prompt: str, r: DemoResult) -> str:
    if r.error and not r.token_ids:
        return f"prompt: {prompt!r}\n  error: {r.error}"
    itl_ms = [x * MS for x in r.timing.itl_s]
    itl = (
        f"ITL mean {statistics.fmean(itl_ms):.1f} ms, p50 {statistics.median(itl_ms):.1f} ms, max {max(itl_ms):.1f} ms"
        if itl_ms
        else "ITL n/a"
    )
    lines = [
        f"prompt: {prompt!r}",
        f"  output ({len(r.token_ids)} tokens, finish={r.finish_reason}): {r.text!r}",
        f"  token ids: {r.token_ids}",
        f"  TTFT {r.timing.ttft_s * MS:.1f} ms, {itl}",
    ]
    if r.transfer is not None:
        t = r.transfer
        hidden = 1 - t.exposed_s / t.transfer_s if t.transfer_s > 0 else 0.0
        lines.append(
            f"  KV {t.prefill_instance} -> {t.decode_instance}: {t.num_bytes / 2**10:.1f} KiB, "
            f"prefill compute {t.compute_s * MS:.1f} ms, transfer {t.transfer_s * MS:.2f} ms, "
            f"exposed {t.exposed_s * MS:.2f} ms (hidden {hidden:.0%})"
        )
    elif r.error:
        lines.append(f"  error: {r.error}")
    return "\n".join(lines)


def chat_wrapper(tokenizer: Tokenizer) -> Callable[[str], str]:
    """`--chat`: each prompt becomes one user message rendered by the model's chat template
    (with the assistant turn opened), as /v1/chat/completions would render it."""
    template = ChatTemplate.for_tokenizer(tokenizer)
    return lambda prompt: template.render([ChatMessage("user", prompt)], add_generation_prompt=True)


async def answer_prompts(
    server,
    prompts: list[str],
    params: SamplingParams,
    out: TextIO = sys.stdout,
    wrap: Callable[[str], str] | None = None,
) -> int:
    """Answer `prompts` together (or stdin lines one by one), each passed through `wrap` first
    when given; returns 2 if any was refused."""
    status = 0
    wrap = wrap or (lambda prompt: prompt)
    if prompts:
        results = await asyncio.gather(*(run_one(server, wrap(p), params) for p in prompts), return_exceptions=True)
        for prompt, result in zip(prompts, results):
            if isinstance(result, InvalidRequestError):
                print(f"prompt: {prompt!r}\n  error: {result}", file=out)
                status = 2
            elif isinstance(result, BaseException):
                raise result
            else:
                print(format_result(prompt, result), file=out)
                status = 2 if result.error and not result.token_ids else status
        return status
    for line in sys.stdin:
        prompt = line.rstrip("\n")
        try:
            print(format_result(prompt, await run_one(server, wrap(prompt), params)), file=out, flush=True)
        except InvalidRequestError as exc:
            print(f"error: {exc}", file=out, flush=True)
    return status


async def run_demo(engine: Engine, demo: DemoConfig, out: TextIO = sys.stdout) -> int:
    """`minipd --role both` without ports: answer `demo.prompts` (or stdin) on `engine`."""
    async with engine:
        wrap = chat_wrapper(engine.tokenizer) if demo.chat else None
        return await answer_prompts(engine, demo.prompts, demo.sampling, out, wrap)
